"""The exchange service with real processes on loopback: two hosts, backpressure, spilling."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.partition import shared_arena
from sparkflow_exchange.writer.selectors import make_selector

SCHEMA = pa.schema([pa.field("producer", pa.int32(), nullable=False), pa.field("seq", pa.int64(), nullable=False),
                    pa.field("key", pa.int64(), nullable=False), pa.field("pad", pa.string())])


def producer_batches(producer: int, rows: int, batch_rows: int = 2000) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, rows, batch_rows):
        seq = np.arange(start, min(start + batch_rows, rows), dtype=np.int64)
        key = (seq * 7919 + producer * 104729) % 1009
        out.append(pa.record_batch([pa.array(np.full(len(seq), producer, np.int32)), pa.array(seq), pa.array(key),
                                    pa.array([f"p{producer}-{s:08d}" for s in seq[:1]] * len(seq))], schema=SCHEMA))
    return out


def expected_rows(producer: int, batches: list[pa.RecordBatch], sub: int, n: int) -> list[int]:
    selector = make_selector("hash", n, producer, SCHEMA, keys=("key",))
    seqs = []
    for b in batches:
        mask = selector.select(b) == sub
        seqs.extend(b.column("seq").to_numpy()[mask].tolist())
    return seqs


def run_producer(config, handle, index: int, batches, results: dict, shared: dict | None = None) -> None:
    task = ex.ProducerTask(handle, index, f"attempt-{index}")
    if shared is not None:
        shared[index] = task.writer.arena is not None
    task.write(batches)
    results[index] = task.finish()["partition"]


class Worker(threading.Thread):
    """A thread that keeps its exception for the test to re-raise."""

    def __init__(self, target, *args) -> None:
        super().__init__(target=target, args=args, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join_all
            self.error = exc


def join_all(workers: list[Worker], deadline: float) -> None:
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.error is not None:
            raise w.error
        assert not w.is_alive(), f"{w.name} did not finish in time"


def read_all(config, desc, sub: int) -> pa.Table:
    return pa.Table.from_batches(list(ex.read_subpartition(config, desc, sub)), schema=SCHEMA)


@pytest.mark.parametrize("partition_type", ["HYBRID", "BLOCKING", "PIPELINED_BOUNDED"])
def test_two_hosts_four_producers_three_consumers(tmp_service, partition_type):
    host_a = tmp_service(host="127.0.0.1", host_id="hostA")
    host_b = tmp_service(host="127.0.0.2", host_id="hostB", coordinator=False, conf={"coordinator": host_a.tcp})
    n, producers, rows = 3, 4, 30_000
    base = dict(exchange=f"two-hosts-{partition_type}", partitioner="hash", keys="key", numSubpartitions=n,
                partitionType=partition_type, bufferSize="32k", buffersPerPartition=4, bufferTimeout="20ms")
    # the driver and the consumers are on host A; producers 0, 1 write to A's service, 2, 3 to B's
    driver = client_config(host_a, hostId="hostA", **base)
    handle = ex.declare_write(driver, SCHEMA, overwrite=True)
    data = {p: producer_batches(p, rows) for p in range(producers)}
    results: dict[int, str] = {}
    shared: dict[int, bool] = {}
    received: dict[int, pa.Table] = {}

    def consume(sub: int) -> None:
        desc = ex.describe_exchange(driver)
        received[sub] = read_all(client_config(host_a, hostId="hostA", **base), desc, sub)

    def produce(p: int) -> None:
        svc = host_a if p < 2 else host_b
        # even producers reach their service over its Unix socket (shared-memory slots), odd ones over TCP
        cfg = client_config(host_a, service=svc.unix if p % 2 == 0 else svc.tcp, hostId=svc.info["host_id"], **base)
        run_producer(cfg, wh.WriteHandle(cfg, handle.name, handle.epoch, handle.write_id, handle.schema_b64,
                                         handle.num_subpartitions, handle.partitioner), p, data[p], results, shared)

    consumers = [Worker(consume, s) for s in range(n)]
    writers = [Worker(produce, p) for p in range(producers)]
    deadline = time.monotonic() + 45
    streaming = partition_type == "PIPELINED_BOUNDED"
    if streaming:  # consume while producing: the pool holds 4 buffers of 32k only
        for t in consumers + writers:
            t.start()
    else:
        for t in writers:
            t.start()
    join_all(writers, deadline)
    wh.commit_write(handle, [results[p] for p in range(producers)])
    if not streaming:
        for t in consumers:
            t.start()
    join_all(consumers, deadline)
    assert sum(t.num_rows for t in received.values()) == producers * rows  # none lost, none duplicated
    # writers on a service's Unix socket used its shared-memory slots (BLOCKING goes straight to disk)
    assert shared == {p: shared_arena.available() and partition_type != "BLOCKING" and p % 2 == 0
                      for p in range(producers)}
    for sub in range(n):
        table = received[sub]
        for p in range(producers):
            got = table.filter(pa.compute.equal(table.column("producer"), p)).column("seq").to_pylist()
            # exactly this subpartition's rows of producer p, in the order p produced them
            assert got == expected_rows(p, data[p], sub, n), (sub, p)
    traffic_a, traffic_b = host_a.status()["traffic"], host_b.status()["traffic"]
    assert traffic_b["remote"] > 0  # host A's consumers read B's partitions over TCP
    if streaming:
        assert traffic_a["local"] > 0  # and A's own partitions over the Unix socket
    else:
        assert traffic_a["local_file"] > 0 or traffic_a["local"] > 0


def test_backpressure_bounds_memory_and_spares_other_channels(tmp_service):
    budget = 16 << 20
    svc = tmp_service(conf={"memory.budget": budget})
    base = dict(partitioner="forward", numSubpartitions=1, partitionType="PIPELINED_BOUNDED", bufferSize="1m",
                buffersPerPartition=4, bufferTimeout="0")
    pool_bytes = 4 << 20
    slow_rows = 50 * pool_bytes // 40  # ~50 pools of 40-byte rows
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.int64()), pa.field("c", pa.int64()),
                        pa.field("d", pa.int64()), pa.field("e", pa.int64())])
    block = pa.record_batch([pa.array(np.arange(100_000, dtype=np.int64))] * 5, schema=schema)
    configs = {name: client_config(svc, exchange=name, hostId="127.0.0.1", **base) for name in ("slow", "fast")}
    handles = {name: ex.declare_write(cfg, schema, overwrite=True) for name, cfg in configs.items()}
    baseline = ex.declare_write(client_config(svc, exchange="baseline", partitioner="forward", numSubpartitions=1),
                                schema, overwrite=True)  # a commit first: what the service loads once ready is in
    first = ex.ProducerTask(baseline, 0, "a0")
    first.write([block.slice(0, 10)])
    wh.commit_write(baseline, [first.finish()["partition"]])
    rss_start = svc.rss_bytes()
    counts = {"slow": 0, "fast": 0}
    finished: dict[str, float] = {}
    producers: dict[str, ex.ProducerTask] = {}
    rss_samples = []
    slow_at_end: dict[str, int] = {}

    def produce(name: str, rows: int) -> None:
        task = ex.ProducerTask(handles[name], 0, "a0")
        producers[name] = task
        task.write(block for _ in range(rows // block.num_rows))
        wh.commit_write(handles[name], [task.finish()["partition"]])

    def consume(name: str, delay: float) -> None:
        desc = ex.describe_exchange(configs[name])
        for batch in ex.read_subpartition(configs[name], desc, 0):
            counts[name] += batch.num_rows
            if delay:
                time.sleep(delay)
        finished[name] = time.monotonic()
        slow_at_end[name] = counts["slow"]

    threads = [threading.Thread(target=consume, args=("slow", 0.01)), threading.Thread(target=consume, args=("fast", 0)),
               threading.Thread(target=produce, args=("slow", slow_rows)),
               threading.Thread(target=produce, args=("fast", slow_rows // 4))]
    for t in threads:
        t.start()
    shared = []  # status snapshots in which both channels were served at once
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads[:2]) and time.monotonic() < deadline:
        rss_samples.append(svc.rss_bytes())
        if not shared and "fast" not in finished and threads[1].is_alive():
            # poll the service's channels (no sleep) until both show up at once
            chans = svc.status()["channels"]
            if len({c["partition"] for c in chans}) == 2:
                shared.append(chans)
            continue
        time.sleep(0.05)
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert counts["slow"] == (slow_rows // block.num_rows) * block.num_rows
    assert counts["fast"] == (slow_rows // 4 // block.num_rows) * block.num_rows
    assert producers["slow"].writer.backpressure_seconds > 0.5, "the writer never waited for credit"
    # the fast channel shares the connection but finished long before the slow one, which was far from done
    assert finished["fast"] < finished["slow"] - 1.0
    assert slow_at_end["fast"] < counts["slow"] // 2, (slow_at_end["fast"], counts["slow"])
    assert shared, "never saw both channels served at once"
    assert len({(c["client"], c["transport"]) for c in shared[0]}) == 1, shared[0]  # one client, one transport
    # the service held no more than the two partitions' pools (plus a fixed overhead), while 50 pools went through
    overhead = 64 << 20
    assert max(rss_samples) <= rss_start + 2 * pool_bytes + overhead, (max(rss_samples) - rss_start) / 2**20


def test_hybrid_without_consumer_spills_and_serves_everything_twice(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="hybrid-late", partitioner="hash", keys="key", numSubpartitions=2,
                        partitionType="HYBRID", bufferSize="16k", buffersPerPartition=4, hostId="elsewhere")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    batches = producer_batches(0, 60_000)
    results: dict[int, str] = {}
    run_producer(cfg, handle, 0, batches, results)
    wh.commit_write(handle, [results[0]])
    part = svc.status()["partitions"][0]
    # finished and on disk: it holds no memory and no pool any more (it used to keep its 4 slots)
    assert part["pool_used"] == part["pool_slots"] == 0 and part["pool_max_slots"] == 4
    assert part["spill_bytes"] > 4 * 16 * 1024  # far more than the pool holds went to disk
    desc = ex.describe_exchange(cfg)
    first = [read_all(cfg, desc, s) for s in range(2)]
    second = [read_all(cfg, desc, s) for s in range(2)]
    assert sum(t.num_rows for t in first) == 60_000
    for a, b in zip(first, second):
        assert a.equals(b)
    for s in range(2):
        assert first[s].column("seq").to_pylist() == expected_rows(0, batches, s, 2)


def test_pipelined_writer_without_consumer_fails_clearly(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="nobody-reads", partitioner="forward", numSubpartitions=1,
                        partitionType="PIPELINED_BOUNDED", bufferSize="8k", buffersPerPartition=2, bufferTimeout="0",
                        **{"pipelined.noConsumerTimeout": "1s"})
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"has been full for .* no consumer is reading it.*HYBRID"):
        task.write(producer_batches(0, 50_000))
    assert time.monotonic() - start < 10
    task.fail("test over")


def test_output_flusher_sends_a_trickle_within_the_buffer_timeout(tmp_service):
    """A few rows, far below bufferSize, reach a running reader before the writer finishes."""
    svc = tmp_service()
    cfg = client_config(svc, exchange="trickle", partitioner="forward", numSubpartitions=1,
                        partitionType="PIPELINED_BOUNDED", bufferTimeout="50ms", hostId="elsewhere")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    arrived: list[float] = []

    def consume() -> None:
        desc = ex.describe_exchange(cfg)
        for _batch in ex.read_subpartition(cfg, desc, 0):
            arrived.append(time.monotonic())

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(0.5)
    sent = time.monotonic()
    task.write(producer_batches(0, 10))  # ten rows: the buffer is nowhere near full
    deadline = time.monotonic() + 5
    while not arrived and time.monotonic() < deadline:
        time.sleep(0.01)
    assert arrived, "a partly filled buffer never reached the running reader"
    assert arrived[0] - sent < 1.0
    wh.commit_write(handle, [task.finish()["partition"]])
    reader.join(10)
    assert not reader.is_alive()


@pytest.mark.parametrize("partition_type", ["BLOCKING", "HYBRID"])
def test_partition_request_resumes_from_a_sequence_number(tmp_service, partition_type):
    """A consumer that reconnects asks for the rest only: buffers from ``resume_from`` on, in order."""
    from sparkflow_exchange.buffer_kinds import BufferKind
    from sparkflow_exchange.network.protocol import BufferResponse, PartitionRequest

    svc = tmp_service()
    cfg = client_config(svc, exchange=f"resume-{partition_type}", partitioner="forward", numSubpartitions=1,
                        partitionType=partition_type, bufferSize="8k", hostId="elsewhere")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    results: dict[int, str] = {}
    run_producer(cfg, handle, 0, producer_batches(0, 20_000), results)
    wh.commit_write(handle, [results[0]])

    def fetch(resume_from: int) -> list[BufferResponse]:
        got = []
        with svc.connect() as conn:
            conn.send(PartitionRequest(results[0], 0, 1, 1000, resume_from))
            while True:
                msg = conn.recv(10)
                assert isinstance(msg, BufferResponse), msg
                got.append(msg)
                if msg.kind == BufferKind.END_OF_PARTITION:
                    return got

    everything = fetch(0)
    assert len(everything) > 10
    rest = fetch(7)
    assert [m.seq for m in rest] == [m.seq for m in everything[7:]]
    assert [bytes(m.payload) for m in rest] == [bytes(m.payload) for m in everything[7:]]


def test_channel_reconnects_and_resumes_after_its_connection_drops(tmp_service):
    from sparkflow_exchange.network.aio_client import ClientRuntime

    svc = tmp_service()
    cfg = client_config(svc, exchange="reconnect", partitioner="forward", numSubpartitions=1,
                        partitionType="HYBRID", bufferSize="8k", hostId="elsewhere")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    results: dict[int, str] = {}
    run_producer(cfg, handle, 0, producer_batches(0, 30_000), results)
    wh.commit_write(handle, [results[0]])
    desc = ex.describe_exchange(cfg)
    runtime = ClientRuntime.get()
    seqs: list[int] = []
    cut: list = []
    for batch in ex.read_subpartition(cfg, desc, 0):
        seqs.extend(batch.column("seq").to_pylist())
        if not cut and len(seqs) > 5000:
            cut = [runtime._connections[(svc.tcp, svc.secret)].result()]
            runtime.call_soon(cut[0].transport.abort)  # the connection to the service drops mid-read
    assert cut and len(seqs) == 30_000
    assert seqs == list(range(30_000))  # every row once, in order, across the reconnect
    assert runtime._connections[(svc.tcp, svc.secret)].result() is not cut[0], "no new connection was opened"


def test_an_append_may_bring_the_same_schema_serialised_otherwise_but_not_another(tmp_service):
    """Arrow Java and pyarrow serialise an equal schema to different bytes: an append is judged by the schema."""
    import base64

    from sparkflow_exchange.buffer import schema_to_b64
    from sparkflow_exchange.calls import call
    from sparkflow_exchange.errors import SchemaMismatch

    svc = tmp_service()
    cfg = client_config(svc, exchange="same-schema")
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    wh.commit_write(ex.declare_write(cfg.replace(num_subpartitions=2, keys=("a",)), schema, overwrite=True), [])

    def append(schema_b64: str) -> dict:
        return call(cfg, "declare", name="same-schema", schema=schema_b64, num_subpartitions=2,
                    partitioner={"name": "hash", "keys": ["a"], "custom": None, "shared": False},
                    partition_type="HYBRID", mode="append", coalesce=False)

    padded = base64.b64encode(base64.b64decode(schema_to_b64(schema)) + b"\0" * 8).decode()
    assert padded != schema_to_b64(schema)
    assert append(padded)["epoch"] >= 1
    with pytest.raises(SchemaMismatch, match="append to exchange 'same-schema' with another schema"):
        append(schema_to_b64(pa.schema([("a", pa.int64()), ("b", pa.large_string())])))
