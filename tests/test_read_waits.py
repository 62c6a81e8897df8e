"""A read of an exchange nobody has declared yet says so when it starts waiting (name, declareTimeout),
not only when the wait ends."""
from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pytest

from harness import client_config
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.errors import ExchangeNotFound


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.seen.set()


@pytest.fixture
def records():
    handler = Records()
    logger = logging.getLogger("sparkflow_exchange.description")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_a_read_waiting_for_its_exchange_says_so_at_once(tmp_service, records):
    svc = tmp_service()
    config = client_config(svc, exchange="late\nname", partitioner="forward", numSubpartitions=1,
                           declareTimeout="600s")
    found: list = []
    reader = threading.Thread(target=lambda: found.append(ex.describe_exchange(config)), daemon=True)
    reader.start()
    assert records.seen.wait(120), "no word while the read waits for its exchange"
    assert records.messages == ["exchange 'late\\nname' is not declared yet: waiting up to 600 s (declareTimeout) "
                                "for a writer to declare it"], records.messages
    assert reader.is_alive() and not found  # it said so while waiting, not when it gave up
    schema = pa.schema([pa.field("id", pa.int64())])
    handle = ex.declare_write(config, schema, overwrite=True)  # the writer comes: the wait ends with its description
    reader.join(120)
    assert found and found[0]["name"] == "late\nname" and found[0]["arrow_schema"] == schema
    ex.abort_write(handle)


def test_a_declared_exchange_is_read_without_a_word(tmp_service, records):
    svc = tmp_service()
    config = client_config(svc, exchange="on-time", partitioner="forward", numSubpartitions=1)
    ex.declare_write(config, pa.schema([pa.field("id", pa.int64())]), overwrite=True)
    assert ex.describe_exchange(config)["name"] == "on-time"
    assert records.messages == []


def test_no_wait_fails_at_once_without_a_warning(tmp_service, records):
    svc = tmp_service()
    with pytest.raises(ExchangeNotFound, match="'missing' does not exist"):
        ex.describe_exchange(client_config(svc, exchange="missing"), wait=False)
    assert records.messages == []
