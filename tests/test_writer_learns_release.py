"""Nothing waits on what is gone: a writer whose partition is released learns it at once, told why.

Against a real service: writers over the Unix socket (shared memory) and TCP, of every partition type,
pushing or waiting for credit, whose exchange is dropped or overwritten mid-write, fail within seconds
with an error that names the drop or overwrite (not after pipelined.noConsumerTimeout, set to 120 s
here, and not blaming a missing consumer); a finish after the release leaves no file behind.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.errors import ExchangeError, ExchangeReplaced

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
QUICK = 10.0  # what "at once" means here, generously: about 2 s on a quiet machine, much longer under load
BOUND = 60.0  # how long the test waits for a writer at all


def config_for(svc, name: str, transport: str, ptype: str, **kw):
    opts = dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=2, partitionType=ptype,
                bufferSize="8k", buffersPerPartition=4, sortBufferSize="64k", bufferTimeout="20ms",
                **{"pipelined.noConsumerTimeout": "120s"})
    if transport == "unix":
        opts.update(service=svc.unix, hostId=svc.info["host_id"])
    else:
        opts.update(hostId="elsewhere")
    opts.update(kw)
    return client_config(svc, **opts)


class Writing:
    """One producer writing batches in a thread until it fails or ``stop`` is set (at most ``limit`` batches)."""

    def __init__(self, config, limit: int = 5_000) -> None:
        self.handle = ex.declare_write(config, SCHEMA, overwrite=True)
        self.task = ex.ProducerTask(self.handle, 0, "a")
        self.stop = threading.Event()
        self.limit = limit
        self.error: BaseException | None = None
        self.failed_at: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _batches(self):
        for i in range(self.limit):
            if self.stop.is_set():
                return
            yield pa.record_batch([pa.array(np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64))], schema=SCHEMA)
            time.sleep(0.002)

    def _run(self) -> None:
        try:
            self.task.write(self._batches())
            self.task.finish()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.failed_at = time.monotonic()
            self.error = exc
            self.task.fail(str(exc))

    def wait_pushed(self) -> None:
        deadline = time.monotonic() + BOUND
        while self.task.writer.buffers_pushed < 2 and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.01)
        assert self.task.writer.buffers_pushed >= 2, "the writer never pushed"


def _replace(config, how: str) -> None:
    if how == "dropped":
        ex.drop_exchange(config.exchange, config)
    else:
        ex.declare_write(config, SCHEMA, overwrite=True)


@pytest.mark.parametrize("how", ["dropped", "overwritten"])
@pytest.mark.parametrize("ptype", ["HYBRID", "BLOCKING", "PIPELINED_BOUNDED"])
@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_writer_fails_at_once_naming_the_drop_or_overwrite(tmp_service, transport, ptype, how):
    svc = tmp_service()
    config = config_for(svc, f"w-{transport}-{ptype[:4]}-{how[:4]}", transport, ptype)
    writing = Writing(config)
    writing.wait_pushed()  # PIPELINED_BOUNDED with no reader: soon waiting for credit
    _replace(config, how)
    replaced_at = time.monotonic()
    writing.thread.join(BOUND)
    writing.stop.set()
    assert not writing.thread.is_alive(), "the writer is still writing"
    assert isinstance(writing.error, ExchangeReplaced), repr(writing.error)
    assert how in str(writing.error) and config.exchange in str(writing.error), str(writing.error)
    assert "consumer" not in str(writing.error)
    assert writing.failed_at - replaced_at < QUICK


def test_a_writer_waiting_for_credit_is_told_at_once(tmp_service):
    """PIPELINED_BOUNDED without a reader: the writer waits for credit (the service grants nothing to a
    released partition); the release reaches it there."""
    svc = tmp_service()
    config = config_for(svc, "credit-wait", "unix", "PIPELINED_BOUNDED")
    writing = Writing(config)
    deadline = time.monotonic() + BOUND
    while writing.task.writer.backpressure_seconds == 0 and writing.task.writer.credit > 0 \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # well inside the wait
    _replace(config, "overwritten")
    replaced_at = time.monotonic()
    writing.thread.join(BOUND)
    assert isinstance(writing.error, ExchangeReplaced) and "overwritten" in str(writing.error)
    assert writing.failed_at - replaced_at < QUICK


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_finish_after_a_drop_fails_and_leaves_no_file(tmp_service, transport):
    svc = tmp_service()
    config = config_for(svc, f"late-finish-{transport}", transport, "BLOCKING", bufferTimeout="0")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a")
    task.write([pa.record_batch([pa.array(np.arange(1000, dtype=np.int64))], schema=SCHEMA)])  # held, not pushed
    ex.drop_exchange(config.exchange, config)
    with pytest.raises(ExchangeReplaced, match="dropped"):
        task.finish()
    task.fail("dropped")
    deadline = time.monotonic() + QUICK
    while svc.status()["partitions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.status()["partitions"] == []
    spill = svc.status()["service"]["spill_dir"]
    from pathlib import Path

    assert [p.name for p in Path(spill).iterdir() if p.suffix in (".data", ".index")] == []


def test_a_losing_attempt_is_told_it_lost_not_that_the_exchange_was_replaced(tmp_service):
    """Releases that are not a drop or overwrite (another attempt won the commit) say so."""
    svc = tmp_service()
    config = config_for(svc, "loser", "tcp", "PIPELINED_BOUNDED")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    winner = ex.ProducerTask(handle, 0, "a1")
    winner.write([pa.record_batch([pa.array(np.arange(10, dtype=np.int64))], schema=SCHEMA)])
    winner_part = winner.finish()["partition"]
    loser = ex.ProducerTask(handle, 0, "a2")
    wh.commit_write(handle, [winner_part])
    with pytest.raises(ExchangeError, match="another attempt of its task won the commit") as err:
        loser.write([pa.record_batch([pa.array(np.arange(200_000, dtype=np.int64))], schema=SCHEMA)])
        loser.finish()
    assert not isinstance(err.value, ExchangeReplaced)
    loser.fail("lost")


@pytest.mark.parametrize("how", ["dropped", "overwritten"])
def test_a_task_that_starts_after_the_drop_or_overwrite_is_told_which(tmp_service, how):
    svc = tmp_service()
    config = config_for(svc, f"late-task-{how[:4]}", "tcp", "HYBRID")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    _replace(config, how)
    with pytest.raises(ExchangeReplaced, match=how if how == "dropped" else "replaced"):
        ex.ProducerTask(handle, 0, "a")
    with pytest.raises(ExchangeReplaced):
        wh.commit_write(handle, [])


def test_a_write_abandoned_for_ttl_is_aborted_and_its_waiting_reader_told_why(tmp_service):
    """A job that died between its tasks' finish and its commit leaves its write open: after ttl with no task
    writing, the service aborts it (a reader waiting for its commit hears why) and the exchange can expire.
    A write whose task still runs is kept."""
    from sparkflow_exchange.errors import ExchangeReadError

    svc = tmp_service(conf={"ttl": "1s"})
    config = config_for(svc, "abandoned", "tcp", "HYBRID", readerTimeout="60s")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a")
    task.write([pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], schema=SCHEMA)])
    task.finish()  # and no commit: the "driver" is gone
    reader = ex.read_subpartition(config, ex.describe_exchange(config), 0)
    start = time.monotonic()
    with pytest.raises(ExchangeReadError, match="abandoned: neither committed nor aborted for ttl=1 s"):
        list(reader)
    assert time.monotonic() - start < BOUND
    deadline = time.monotonic() + BOUND
    while ex.list_exchanges(config) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ex.list_exchanges(config) == []

    running = Writing(config_for(svc, "still-writing", "tcp", "HYBRID"), limit=10**9)
    writing_config = config_for(svc, "still-writing", "tcp", "HYBRID")
    try:
        running.wait_pushed()
        time.sleep(3)  # three ttls: a write with a running task is not abandoned
        assert [e["name"] for e in ex.list_exchanges(writing_config)] == ["still-writing"]
        assert running.error is None
    finally:
        running.stop.set()
        running.thread.join(BOUND)
