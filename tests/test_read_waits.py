"""A read of an exchange nobody has declared yet says so when it starts waiting (name, declareTimeout),
not only when the wait ends."""
from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
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
    logger = logging.getLogger("sparkflow_exchange.calls")
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
    assert found and found[0].name == "late\nname" and found[0].arrow_schema == schema
    wh.abort_write(handle)


def test_a_declared_exchange_is_read_without_a_word(tmp_service, records):
    svc = tmp_service()
    config = client_config(svc, exchange="on-time", partitioner="forward", numSubpartitions=1)
    ex.declare_write(config, pa.schema([pa.field("id", pa.int64())]), overwrite=True)
    assert ex.describe_exchange(config).name == "on-time"
    assert records.messages == []


def test_no_wait_fails_at_once_without_a_warning(tmp_service, records):
    svc = tmp_service()
    with pytest.raises(ExchangeNotFound, match="'missing' does not exist"):
        ex.describe_exchange(client_config(svc, exchange="missing"), wait=False)
    assert records.messages == []


def test_a_wait_until_sealed_is_answered_by_the_commit_not_by_polling():
    """get_exchange(until_sealed=True) waits at the coordinator for the commit (the JVM catalog's commitTimeout
    waits this way): it answers when the write commits or aborts, at once for a sealed or unknown exchange,
    and with the exchange as it is when its wait ends."""
    import asyncio

    from sparkflow_exchange.errors import ServiceError
    from sparkflow_exchange.service.coordinator import Coordinator

    async def scenario() -> dict:
        coord = Coordinator(lambda targets, reason="", code="": None)
        coord.services.register("s", "host", "127.0.0.1:1", "", 1)  # the service holding its partitions
        d = await coord.declare("x", "schema", 2, {"name": "hash", "keys": ["id"]}, "HYBRID", "overwrite")
        await coord.register_producer("x", d["epoch"], d["write_id"], 0, "a0", "p0", {"service_id": "s"})
        waiting = asyncio.ensure_future(coord.get_exchange("x", wait=60, until_sealed=True))
        await asyncio.sleep(0.2)
        out = {"waiting_while_open": not waiting.done()}
        await coord.producer_finished("x", d["epoch"], "p0")
        await asyncio.sleep(0.1)
        out["waiting_after_a_producer_finished"] = not waiting.done()
        await coord.commit("x", d["epoch"], d["write_id"], ["p0"])
        out["answer"] = await asyncio.wait_for(waiting, 5)
        out["sealed_at_once"] = await asyncio.wait_for(coord.get_exchange("x", wait=60, until_sealed=True), 1)
        d2 = await coord.declare("x", "schema", 2, {"name": "hash", "keys": ["id"]}, "HYBRID", "append")
        out["timed_out"] = await coord.get_exchange("x", wait=0.3, until_sealed=True)
        aborting = asyncio.ensure_future(coord.get_exchange("x", wait=60, until_sealed=True))
        await asyncio.sleep(0.1)
        await coord.abort("x", d2["epoch"], d2["write_id"], "the job failed")
        out["after_abort"] = await asyncio.wait_for(aborting, 5)
        try:
            await asyncio.wait_for(coord.get_exchange("nobody", wait=60, until_sealed=True), 1)
        except ServiceError as exc:
            out["unknown"] = exc.code
        return out

    out = asyncio.run(scenario())
    assert out["waiting_while_open"] and out["waiting_after_a_producer_finished"], out
    assert out["answer"]["sealed"] and out["answer"]["committed"] == ["p0"]
    assert out["sealed_at_once"]["sealed"]
    assert out["timed_out"]["state"] == "open" and not out["timed_out"]["sealed"]
    assert out["after_abort"]["sealed"] and out["after_abort"]["committed"] == ["p0"]
    assert out["unknown"] == "no_exchange"
