"""Failing fast: every failure on the data path reaches the reader at once, naming what happened.

Each case runs against a real service process; none may wait for readerTimeout (set to 60 s here).
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer_kinds import BufferKind
from sparkflow_exchange.consumer.input_gate import InputGate
from sparkflow_exchange.errors import ExchangeReadError
from sparkflow_exchange.network.protocol import BufferResponse, ErrorResponse, PartitionRequest
from sparkflow_exchange.partition import shared_arena
from sparkflow_exchange.partition.shared_arena import ArenaReader, SharedArena
from sparkflow_exchange.service.coordinator import Coordinator

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
SLOW = "60s"  # readerTimeout: a test that needs it to end has failed
QUICK = 10.0  # what "at once" means here, generously


def batches(rows: int, start: int = 0, per: int = 5000) -> list[pa.RecordBatch]:
    out = []
    for lo in range(start, start + rows, per):
        ids = pa.array(np.arange(lo, min(lo + per, start + rows), dtype=np.int64))
        out.append(pa.record_batch([ids, pa.compute.cast(ids, pa.string())], schema=SCHEMA))
    return out


def write(config, rows: int, producers: int = 1) -> tuple[wh.WriteHandle, list[str]]:
    """Write ``rows`` rows per producer, finish every producer, do not commit."""
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    parts = []
    for p in range(producers):
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write(batches(rows, start=p * rows))
        parts.append(task.finish()["partition"])
    return handle, parts


def read_ids(config, desc=None, sub: int = 0) -> list[int]:
    desc = desc or ex.describe_exchange(config)
    return [i for b in ex.read_subpartition(config, desc, sub) for i in b.column("id").to_pylist()]


def remote(svc, name: str, **kw):
    """A client that is on another host than the service: every read goes over TCP."""
    opts = dict(exchange=name, partitioner="forward", numSubpartitions=1, partitionType="BLOCKING",
                bufferSize="8k", hostId="elsewhere", readerTimeout=SLOW)
    opts.update(kw)
    return client_config(svc, **opts)


def spill_paths(svc) -> list[Path]:
    return [Path(p["spill_path"]) for p in svc.status()["partitions"] if p["spill_path"]]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ------------------------------------------------------------------ 1. commit wins over a late abort
def test_coordinator_ignores_an_abort_after_commit():
    released: list = []

    async def scenario() -> dict:
        coord = Coordinator(lambda targets, reason="", code="": released.extend(targets))
        coord.services.register("s", "host", "127.0.0.1:1", "", 1)  # the service holding its partitions
        d = await coord.declare("x", "schema", 1, {"name": "forward"}, "HYBRID", "overwrite")
        await coord.register_producer("x", d["epoch"], d["write_id"], 0, "a0", "p0", {"service_id": "s"})
        await coord.producer_finished("x", d["epoch"], "p0")
        await coord.commit("x", d["epoch"], d["write_id"], ["p0"])
        answer = await coord.abort("x", d["epoch"], d["write_id"], "job failed after commit")
        return {"answer": answer, "desc": coord.exchanges["x"].describe()}

    out = asyncio.run(scenario())
    assert released == []
    assert out["desc"]["state"] == "committed" and out["desc"]["sealed"]
    assert out["desc"]["committed"] == ["p0"] and [p["partition"] for p in out["desc"]["producers"]] == ["p0"]
    assert "committed" in out["answer"].get("ignored", "")


def test_abort_after_commit_keeps_every_row(tmp_service):
    svc = tmp_service()
    config = remote(svc, "late-abort", partitionType="HYBRID", partitioner="hash", keys="id")
    handle, parts = write(config, 20_000, producers=2)
    wh.commit_write(handle, parts)
    wh.abort_write(handle, "Spark aborted the job after our commit")
    assert len(svc.status()["partitions"]) == 2
    desc = ex.describe_exchange(config)
    assert desc.state == "committed"
    assert sorted(read_ids(config, desc)) == list(range(40_000))


# ------------------------------------------------------------------ 2. a failing spill read is an ErrorResponse
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_spill_file_damaged_under_the_service_fails_the_read_at_once(tmp_service, damage):
    svc = tmp_service()
    config = remote(svc, f"spill-{damage}")
    handle, parts = write(config, 30_000)
    wh.commit_write(handle, parts)
    (data,) = spill_paths(svc)
    if damage == "truncate":
        os.truncate(data, data.stat().st_size // 2)
    else:
        data.unlink()
    start = time.monotonic()
    with pytest.raises(ExchangeReadError) as err:
        read_ids(config)
    assert time.monotonic() - start < QUICK
    message = str(err.value)
    assert parts[0] in message and "subpartition 0" in message and str(data) in message, message
    # the service goes on serving other channels
    other = remote(svc, "healthy")
    handle, parts = write(other, 1000)
    wh.commit_write(handle, parts)
    assert sorted(read_ids(other)) == list(range(1000))


# ------------------------------------------------------------------ 3. a damaged index is "corrupt", never 0 rows
def _damage_index(index: Path, how: str) -> None:
    data = bytearray(index.read_bytes())
    if how == "truncate":
        del data[-3:]
    elif how == "garbage":
        data[8:] = b"\xff" * (len(data) - 8)  # every entry names subpartition -1
    elif how == "offset":
        data[8 + 12:8 + 20] = (1 << 40).to_bytes(8, "big")  # first entry's offset far past the data file
    index.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "garbage", "offset"])
def test_damaged_index_in_the_local_file_path_is_named_corrupt(tmp_service, how):
    svc = tmp_service()
    config = client_config(svc, exchange=f"index-{how}", partitioner="forward", numSubpartitions=1,
                           partitionType="BLOCKING", bufferSize="8k", hostId=svc.info["host_id"], readerTimeout=SLOW)
    handle, parts = write(config, 20_000)
    wh.commit_write(handle, parts)
    (data,) = spill_paths(svc)
    index = data.with_suffix(".index")
    _damage_index(index, how)
    start = time.monotonic()
    with pytest.raises(ExchangeReadError) as err:
        read_ids(config)
    assert time.monotonic() - start < QUICK
    message = str(err.value)
    assert "corrupt" in message and str(index) in message and parts[0] in message, message


# ------------------------------------------------------------------ 4. releasing a partition tells its readers
@pytest.mark.parametrize("how", ["dropped", "overwritten"])
def test_released_partition_tells_its_connected_reader_at_once(tmp_service, how):
    svc = tmp_service()
    config = remote(svc, f"release-{how}", partitionType="HYBRID")
    handle, parts = write(config, 50_000)
    wh.commit_write(handle, parts)
    with svc.connect() as conn:
        conn.send(PartitionRequest(parts[0], 0, 7, 1, 0))  # one credit: the rest waits on the service
        first = conn.recv(10)
        assert isinstance(first, BufferResponse) and first.kind == BufferKind.DATA
        if how == "dropped":
            ex.drop_exchange("release-dropped", config)
        else:  # an overwrite releases the version it replaces when it commits (a failed one changes nothing)
            wh.commit_write(*write(config, 10))
        msg = conn.recv(QUICK)
        assert isinstance(msg, ErrorResponse) and msg.receiver_id == 7, msg
        assert f"partition {parts[0]} of exchange 'release-{how}' was released: {how}" in msg.message
        assert not msg.fatal
        assert conn.call("ping")["service_id"]  # the connection goes on


def test_released_partition_fails_a_planned_read_at_once(tmp_service):
    """A read of a sealed exchange has no coordinator subscription: only the service can tell it."""
    svc = tmp_service()
    config = remote(svc, "release-planned", partitionType="HYBRID", buffersPerChannel=1, floatingBuffersPerGate=1)
    handle, parts = write(config, 50_000)
    wh.commit_write(handle, parts)
    reader = ex.read_subpartition(config, ex.describe_exchange(config), 0)
    next(reader)
    ex.drop_exchange("release-planned", config)
    start = time.monotonic()
    with pytest.raises(ExchangeReadError, match="was released: dropped"):
        for _ in reader:
            pass
    assert time.monotonic() - start < QUICK


# ------------------------------------------------------------------ 5. a failed channel cancels its view
def test_failed_channel_cancels_its_view_on_the_service(tmp_service):
    svc = tmp_service()
    config = remote(svc, "failed-channel", partitionType="HYBRID", buffersPerChannel=1, floatingBuffersPerGate=1)
    handle, parts = write(config, 50_000)
    wh.commit_write(handle, parts)
    desc = ex.describe_exchange(config)
    gate = InputGate(config, desc, 0, svc.tcp, svc.secret, "elsewhere", producers=desc.sealed_producers())
    reader = iter(gate)
    next(reader)
    assert len(svc.status()["channels"]) == 1
    (channel,) = gate.channels.values()
    gate.runtime.call_soon(channel.fail, "the reader found something wrong with a buffer")
    with pytest.raises(ExchangeReadError, match="found something wrong"):
        for _ in reader:
            pass
    deadline = time.monotonic() + QUICK
    while svc.status()["channels"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.status()["channels"] == []


# ------------------------------------------------------------------ 6. file descriptors stay bounded
def test_cancelled_local_file_channels_close_their_files(tmp_service):
    svc = tmp_service()
    config = client_config(svc, exchange="fd-files", partitioner="hash", keys="id", numSubpartitions=2,
                           partitionType="BLOCKING", bufferSize="8k", hostId=svc.info["host_id"], readerTimeout=SLOW)
    handle, parts = write(config, 2000, producers=8)
    wh.commit_write(handle, parts)
    damaged = sorted(spill_paths(svc))[-1].with_suffix(".index")
    _damage_index(damaged, "truncate")  # one channel fails: the gate cancels the seven that opened their file
    desc = ex.describe_exchange(config)
    with pytest.raises(ExchangeReadError, match="corrupt"):
        read_ids(config, desc, 0)  # the seven good files stay mapped for this process's next reads
    time.sleep(0.3)  # the gate closes on the IO thread
    before = open_fds()
    for _ in range(3):
        with pytest.raises(ExchangeReadError, match="corrupt"):
            read_ids(config, desc, 0)
    time.sleep(0.3)
    assert open_fds() - before <= 2, os.listdir("/proc/self/fd")


@pytest.mark.skipif(not shared_arena.available(), reason="no writable /dev/shm")
def test_arena_reader_keeps_few_arena_files_open():
    arenas = [SharedArena.create(2, 4096) for _ in range(20)]
    try:
        for i, arena in enumerate(arenas):
            arena.slot(1)[:8] = i.to_bytes(8, "big")
        reader = ArenaReader()
        before = open_fds()
        peak = 0
        for _ in range(2):
            for i, arena in enumerate(arenas):
                got = reader.copy_out(str(arena.path), 4096, 8, bytearray(8))
                assert int.from_bytes(got, "big") == i
                peak = max(peak, open_fds() - before)
        assert peak <= ArenaReader.MAX_OPEN
        reader.close()
        assert open_fds() <= before
    finally:
        for arena in arenas:
            arena.unlink()


@pytest.mark.parametrize("shared", ["true", "false"])
def test_abort_does_not_wait_for_a_flusher_stuck_on_credit(tmp_service, shared):
    """A PIPELINED_BOUNDED writer with no consumer: its output flusher blocks waiting for credit. The task's
    abort must end the write at once, not after pipelined.noConsumerTimeout."""
    from test_service import SCHEMA, producer_batches

    svc = tmp_service()
    config = client_config(svc, service=svc.unix, hostId=svc.info["host_id"], exchange="stuck", partitioner="hash",
                           keys="key", numSubpartitions=1, partitionType="PIPELINED_BOUNDED", bufferSize="64k",
                           buffersPerPartition=2, bufferTimeout="20ms", sharedMemory=shared,
                           **{"pipelined.noConsumerTimeout": "60"})
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "attempt-0")
    deadline = time.monotonic() + 20
    for batch in producer_batches(0, 200_000, batch_rows=200):  # small batches: the flusher does the pushing
        task.write([batch])
        if task.writer.backpressure_seconds or (task.writer.credit <= 0 and task.writer.buffers_pushed >= 2):
            break
        assert time.monotonic() < deadline
    time.sleep(0.3)  # the flusher is now waiting for credit that no consumer will free
    start = time.monotonic()
    task.fail("the Spark task was killed")
    assert time.monotonic() - start < 5
    status = svc.connect().call("status")
    states = [p["state"] for p in status["partitions"] if p["exchange"] == "stuck"]
    assert states == ["failed"]


def test_a_short_credit_poll_leaves_the_connections_timeout_alone(tmp_service):
    svc = tmp_service()
    from sparkflow_exchange.network.protocol import RpcRequest

    conn = svc.connect()
    conn.send(RpcRequest(99, "ping", {}))
    deadline = time.monotonic() + 10
    got = []
    while not got:  # zero-timeout looks, as a writer polls for credit, until the answer is there
        got = conn.poll()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert conn.sock.gettimeout() == conn.timeout  # the next blocking send still has the connection's timeout
    conn.close()


@pytest.mark.parametrize("partition_type", ["PIPELINED_BOUNDED", "HYBRID"])
def test_a_service_stopped_for_3_s_mid_write_and_read_loses_nothing(tmp_service, partition_type):
    """SIGSTOP of the service while a producer writes and a consumer reads (TCP and Unix), SIGCONT after
    3 s: both complete with every row; nothing times out or fails meanwhile."""
    import signal

    from test_service import SCHEMA, Worker, join_all, producer_batches

    svc = tmp_service(host_id="hostA")
    base = dict(exchange=f"sigstop-{partition_type}", partitioner="hash", keys="key", numSubpartitions=2,
                partitionType=partition_type, bufferSize="32k", buffersPerPartition=4, bufferTimeout="20ms")
    writer_config = client_config(svc, service=svc.unix, hostId="hostA", **base)
    reader_config = client_config(svc, hostId="elsewhere", **base)  # a remote reader over TCP
    handle = ex.declare_write(writer_config, SCHEMA, overwrite=True)
    batches = producer_batches(0, 200_000, batch_rows=1000)
    results: dict = {}
    tables: dict = {}

    def produce() -> None:
        task = ex.ProducerTask(handle, 0, "attempt-0")
        for batch in batches:
            task.write([batch])
            time.sleep(0.01)  # about 2 s of writing: the stop lands in the middle
        results["partition"] = task.finish()["partition"]
        wh.commit_write(handle, [results["partition"]], rows={results["partition"]: 200_000})

    def consume(sub: int) -> None:
        desc = ex.describe_exchange(reader_config)
        tables[sub] = pa.Table.from_batches(list(ex.read_subpartition(reader_config, desc, sub)), schema=SCHEMA)

    workers = [Worker(consume, 0), Worker(consume, 1), Worker(produce)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    os.kill(svc.proc.pid, signal.SIGSTOP)
    assert "partition" not in results  # mid-write
    try:
        time.sleep(3)
    finally:
        os.kill(svc.proc.pid, signal.SIGCONT)
    join_all(workers, time.monotonic() + 60)
    assert tables[0].num_rows + tables[1].num_rows == 200_000
    got = sorted(pa.concat_tables([tables[0], tables[1]]).column("seq").to_pylist())
    assert got == list(range(200_000))
