"""Exhaustion degrades to errors: a service at its open-file limit (RLIMIT_NOFILE set in its process, as
``ulimit -n`` would) refuses what it cannot serve with an error that says so, keeps serving the rest,
serves new clients once fds are free again, and keeps its log small."""
from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer_kinds import BufferKind
from sparkflow_exchange.description import ExchangeDescription
from sparkflow_exchange.network.aio_client import next_receiver_id, open_connection
from sparkflow_exchange.network.blocking_client import BlockingConnection, ServiceError
from sparkflow_exchange.network.protocol import (
    AddCredit,
    BufferResponse,
    ErrorResponse,
    PartitionRegistered,
    PartitionRequest,
    RegisterPartition,
)

NOFILE = 256
PRODUCERS = 8
WIDTH = 4
ROWS = 1000  # per producer
SCHEMA = pa.schema([pa.field("id", pa.int64())])


def _write(svc, name: str) -> ExchangeDescription:
    """A committed BLOCKING exchange of PRODUCERS x WIDTH (spill files the service serves from disk)."""
    cfg = client_config(svc, exchange=name, partitioner="hash", keys="id", numSubpartitions=str(WIDTH),
                        partitionType="BLOCKING")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    parts = []
    for p in range(PRODUCERS):
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write([pa.record_batch([pa.array(range(p * ROWS, (p + 1) * ROWS))], schema=SCHEMA)])
        parts.append(task.finish()["partition"])
    wh.commit_write(handle, parts)
    return ex.describe_exchange(cfg)


class _Channel:
    """One subpartition of one producer, read at the wire level with a credit per buffer."""

    def __init__(self, conn, rid: int) -> None:
        self.conn, self.rid = conn, rid
        self.done = asyncio.get_running_loop().create_future()
        self.buffers = 0

    def on_message(self, msg) -> None:
        if isinstance(msg, ErrorResponse):
            self._end(msg.message)
        elif isinstance(msg, BufferResponse):
            if msg.kind == BufferKind.END_OF_PARTITION:
                self._end(None)
            elif msg.kind == BufferKind.DATA:
                self.buffers += 1
                self.conn.send(AddCredit(self.rid, 1))

    def on_connection_lost(self, reason: str) -> None:
        self._end(reason)

    def _end(self, error: str | None) -> None:
        if not self.done.done():
            self.done.set_result(error)


async def _readers(svc, desc: ExchangeDescription, count: int) -> list[str | list]:
    """``count`` readers, each on its own TCP connection from another host (the service serves every byte):
    all connect, then each reads one subpartition of every producer. Each reader's outcome: the error that
    refused it, or the error (None when complete) of each of its channels."""
    async def connect():
        try:
            return await open_connection(svc.tcp, svc.secret, host_id="another-host", timeout=60)
        except ServiceError as exc:
            return str(exc)

    conns = await asyncio.gather(*(connect() for _ in range(count)))
    outcomes: list = []
    for r, conn in enumerate(conns):
        if isinstance(conn, str):
            outcomes.append(conn)
            continue
        channels = []
        for producer in desc.producers:
            rid = next_receiver_id()
            channel = conn.channels[rid] = _Channel(conn, rid)
            conn.send(PartitionRequest(producer["partition"], r % WIDTH, rid, 2))
            channels.append(channel)
        outcomes.append(channels)
    results = []
    for outcome in outcomes:
        results.append(outcome if isinstance(outcome, str) else
                       [await asyncio.wait_for(c.done, 120) for c in outcome])
    for conn in conns:
        if not isinstance(conn, str):
            conn.transport.close()
    await asyncio.sleep(0.1)
    return results


def _read_all(svc, desc: ExchangeDescription) -> int:
    cfg = client_config(svc, exchange=desc.name)
    return sum(batch.num_rows for sub in range(WIDTH) for batch in ex.read_subpartition(cfg, desc, sub))


def test_at_its_fd_limit_a_service_refuses_clearly_and_serves_again(tmp_service):
    svc = tmp_service(nofile=NOFILE, conf={"helloTimeout": "60"})  # readers slow to say Hello are not cut off
    desc = _write(svc, "data")
    log = svc.home / "service.log"

    # 200 concurrent readers, each on a connection of its own: more than the fd limit leaves room for
    results = asyncio.run(_readers(svc, desc, 200))
    refused = [r for r in results if isinstance(r, str)]
    served = [r for r in results if not isinstance(r, str)]
    assert refused and served, (len(refused), len(served))
    for message in refused:  # by a cap the fd limit lowered, or for want of an fd: each says so
        assert f"open-file limit {NOFILE}" in message, message
    for channels in served:
        assert channels == [None] * PRODUCERS  # a reader that was let in got everything

    cold = _write(svc, "cold")  # not read yet: none of its spill files is open
    reader = svc.connect()

    # then running partitions take every fd left (each holds its spill file open for writing): a
    # registration fails with EMFILE named, the connection that asked goes on
    hog = svc.connect()
    held = 0
    while True:
        hog.send(RegisterPartition(f"hog.{held}", 1, "HYBRID", exchange="hog"))
        answer = hog.recv(30)
        while not isinstance(answer, (PartitionRegistered, ErrorResponse)):
            answer = hog.recv(30)
        if isinstance(answer, ErrorResponse):
            assert not answer.fatal and "out of file descriptors" in answer.message, answer.message
            assert f"open-file limit {NOFILE}" in answer.message and "Too many open files" in answer.message
            break
        held += 1
        assert held < NOFILE, "registrations never ran out of fds"
    assert hog.call("ping")["service_id"]
    # a read that needs a spill file opened fails, naming the limit; its connection goes on
    reader.send(PartitionRequest(cold.producers[0]["partition"], 0, 1, 2))
    error = reader.recv(30)
    assert isinstance(error, ErrorResponse) and error.receiver_id == 1 and not error.fatal, error
    assert "out of file descriptors" in error.message and f"open-file limit {NOFILE}" in error.message
    assert reader.call("ping")["service_id"]
    # a newcomer meanwhile: refused with an error saying why, or let in (a connection frees an fd or
    # the service has kept one back for this), never left hanging
    try:
        with BlockingConnection(svc.tcp, svc.secret, timeout=30) as conn:
            conn.call("ping")
    except ServiceError as exc:
        assert "file descriptors" in str(exc) or "open-file limit" in str(exc), str(exc)
    hog.close()  # its running partitions fail and close their files
    reader.close()

    # a new client is served in full
    assert _read_all(svc, desc) == _read_all(svc, cold) == PRODUCERS * ROWS
    results = asyncio.run(_readers(svc, desc, 20))
    assert all(r == [None] * PRODUCERS for r in results), results
    assert svc.proc.poll() is None
    assert log.stat().st_size < 1 << 20, f"{log.stat().st_size} bytes of log"


def test_caps_are_lowered_to_fit_the_fd_limit_and_say_so():
    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.service.fd_budget import fd_budget

    roomy = fd_budget(ExchangeConfig(), 1 << 20)
    assert (roomy.spill_reads, roomy.connections, roomy.strangers, roomy.notes) == (256, 4096, 128, {})
    tight = fd_budget(ExchangeConfig(), NOFILE)
    # the spill cache, connections and strangers together leave a quarter for running partitions
    assert tight.spill_reads + tight.connections + tight.strangers <= NOFILE * 7 // 8
    assert tight.connections < 4096 and tight.spill_reads < 256
    assert tight.notes["maxConnections"] == f" (configured 4096, lowered to fit the open-file limit {NOFILE})"


def test_each_kind_of_log_message_is_rate_limited():
    import logging

    from sparkflow_exchange.service.log_limit import RateLimit

    now = [0.0]
    limit = RateLimit(burst=3, window=10.0, clock=lambda: now[0])

    def record(msg: str, exc: bool = False) -> logging.LogRecord:
        return logging.LogRecord("svc", logging.WARNING, __file__, 1, msg, ("x",),
                                 (ValueError, ValueError("boom"), None) if exc else None)

    kept = [r for r in (record("closing %s", exc=True) for _ in range(1000)) if limit.filter(r)]
    assert len(kept) == 3 and kept[0].exc_info is not None and kept[1].exc_info is None  # one traceback
    assert limit.filter(record("another kind %s"))
    now[0] = 10.0
    again = record("closing %s")
    assert limit.filter(again) and "997 more like the next one left out" in again.getMessage()


def test_a_write_the_disk_has_no_room_for_fails_clearly_and_others_go_on(tmp_service):
    """Spill files capped at 1 MiB (RLIMIT_FSIZE: pwrite beyond fails with EFBIG, as ENOSPC would on a full
    disk): the write that needs more fails naming the spill files; smaller writes and reads go on."""
    svc = tmp_service(fsize=1 << 20)
    big = client_config(svc, exchange="big", partitioner="hash", keys="id", numSubpartitions="2",
                        partitionType="BLOCKING", compression="none")  # 3.2 MB on disk, not what zstd makes of it
    handle = ex.declare_write(big, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    with pytest.raises((ServiceError, ex.ExchangeError), match="no room left for spill files") as failed:
        task.write([pa.record_batch([pa.array(range(i, i + 100_000))], schema=SCHEMA)
                    for i in range(0, 400_000, 100_000)])  # 3.2 MB
        task.finish()
    assert f"partition {task.partition}" in str(failed.value)
    task.fail("the test")
    desc = _write(svc, "small")  # 8 x 8 KB
    assert _read_all(svc, desc) == PRODUCERS * ROWS
    assert svc.proc.poll() is None
