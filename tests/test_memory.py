"""Memory as Flink manages it: one byte-counted budget shared out among running partitions.

Real service processes: hundreds of partitions alive at once with default settings, RSS within the
budget, bounded fds with thousands of finished partitions, a bounded writer that waits for memory
and proceeds when a consumer frees it.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from harness import client_config, fd_count
from test_bad_input import RawClient, healthy
from test_service import SCHEMA, Worker, join_all, producer_batches

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer_kinds import BufferKind
from sparkflow_exchange.network.protocol import (
    BufferResponse,
    ErrorResponse,
    FinishPartition,
    PartitionFinished,
    PartitionRegistered,
    PartitionRequest,
    ProducerCredit,
    PushBuffer,
    RegisterPartition,
)
from sparkflow_exchange.writer.selectors import make_selector

MiB = 1 << 20


def expected_subpartitions(batches_by_producer: dict[int, list[pa.RecordBatch]], n: int) -> list[pa.Table]:
    """Every producer's rows, routed as the hash selector routes them, in the order they were written."""
    out: list[list[pa.Table]] = [[] for _ in range(n)]
    for p, batches in batches_by_producer.items():
        selector = make_selector("hash", n, p, SCHEMA, keys=("key",))
        table = pa.Table.from_batches(batches, schema=SCHEMA)
        subs = np.concatenate([selector.select(b) for b in batches])
        for s in range(n):
            out[s].append(table.filter(pa.array(subs == s)))
    return [pa.concat_tables(t) for t in out]


def by_producer_and_seq(table: pa.Table) -> pa.Table:
    return table.sort_by([("producer", "ascending"), ("seq", "ascending")])


def write_exchange(svc, name: str, producers: int, n: int, rows: int, wave: int) -> dict[int, list[pa.RecordBatch]]:
    """``producers`` HYBRID partitions with default settings, ``wave`` of them registered and running at
    once (each registration shrinks the others' share), all finished and committed."""
    cfg = client_config(svc, exchange=name, partitioner="hash", keys="key", numSubpartitions=n, bufferTimeout="0")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    data = {p: producer_batches(p, rows, batch_rows=rows) for p in range(producers)}
    finished = []
    for start in range(0, producers, wave):
        tasks = [ex.ProducerTask(handle, p, f"a{p}") for p in range(start, min(start + wave, producers))]
        for task in tasks:
            task.write(data[task.index])
        finished += [task.finish()["partition"] for task in tasks]
    wh.commit_write(handle, finished)
    return data


def check_exchange(svc, name: str, data, n: int) -> None:
    cfg = client_config(svc, exchange=name)
    desc = ex.describe_exchange(cfg)
    expected = expected_subpartitions(data, n)
    for s in range(n):
        got = pa.Table.from_batches(list(ex.read_subpartition(cfg, desc, s)), schema=SCHEMA)
        assert got.num_rows == expected[s].num_rows, (name, s)
        assert by_producer_and_seq(got).equals(by_producer_and_seq(expected[s])), (name, s)
        for p in (0, len(data) - 1):  # and each producer's rows in the order it wrote them
            mask = pc.equal(got.column("producer"), p)
            assert got.filter(mask).column("seq").equals(expected[s].filter(pc.equal(expected[s].column("producer"), p))
                                                         .column("seq")), (name, s, p)


def test_three_exchanges_of_200_hybrid_producers_and_16_subpartitions_alive_at_once(tmp_service):
    """Default settings (1 GiB budget, 16 x 1 MiB per partition): 600 partitions registered, written,
    finished and alive together, 200 of them running at once; the old reservation refused the 65th."""
    svc = tmp_service()
    data = {name: write_exchange(svc, name, 200, 16, 160, wave=200) for name in ("ex-a", "ex-b", "ex-c")}
    status = svc.status()
    assert len(status["partitions"]) == 600
    assert status["memory"]["used"] == 0 and status["memory"]["running_pools"] == 0  # finished: all on disk
    for name, d in data.items():
        check_exchange(svc, name, d, 16)


def test_a_thousand_producers_of_four_subpartitions(tmp_service):
    svc = tmp_service()
    data = write_exchange(svc, "ex-1000", 1000, 4, 40, wave=250)
    assert len(svc.status()["partitions"]) == 1000
    check_exchange(svc, "ex-1000", data, 4)


def test_service_rss_stays_within_the_budget_with_many_concurrent_partitions(tmp_service):
    """64 MiB budget, 32 writers over TCP at once (the service holds their bytes itself), 24 HYBRID
    without a consumer and 8 PIPELINED_BOUNDED read slowly: RSS stays under budget + 64 MiB."""
    budget = 64 * MiB
    svc = tmp_service(conf={"memory.budget": budget})
    block = pa.record_batch([pa.array(np.arange(50_000, dtype=np.int64))] * 5,
                            names=["a", "b", "c", "d", "e"])  # 2 MB: two 1 MiB buffers
    schema = block.schema
    rows_each = 12 * block.num_rows  # ~24 MB per writer, ~770 MB through the service in all
    samples: list[int] = []
    used: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(svc.rss_bytes())
            used.append(svc.status()["memory"]["used"])
            time.sleep(0.05)

    def produce(name: str, ptype: str) -> None:
        cfg = client_config(svc, exchange=name, partitioner="forward", numSubpartitions=1, partitionType=ptype,
                            bufferTimeout="0")
        handle = ex.declare_write(cfg, schema, overwrite=True)
        task = ex.ProducerTask(handle, 0, "a0")
        task.write(block for _ in range(rows_each // block.num_rows))
        wh.commit_write(handle, [task.finish()["partition"]])

    counts: dict[str, int] = {}

    def consume(name: str) -> None:
        cfg = client_config(svc, exchange=name)
        counts[name] = 0
        for batch in ex.read_subpartition(cfg, ex.describe_exchange(cfg), 0):
            counts[name] += batch.num_rows
            time.sleep(0.02)

    workers = [Worker(produce, f"rss-h{i}", "HYBRID") for i in range(24)]
    workers += [Worker(produce, f"rss-p{i}", "PIPELINED_BOUNDED") for i in range(8)]
    readers = [Worker(consume, f"rss-p{i}") for i in range(8)]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for w in workers + readers:
        w.start()
    join_all(workers + readers, time.monotonic() + 120)
    stop.set()
    sampler.join(5)
    assert all(counts[f"rss-p{i}"] == rows_each for i in range(8))
    assert max(used) <= budget, max(used) / MiB
    print(f"service RSS peak {max(samples) / MiB:.0f} MiB, pool peak {max(used) / MiB:.0f} MiB, {len(samples)} samples")
    assert max(samples) <= budget + 64 * MiB, f"service RSS peaked at {max(samples) / MiB:.0f} MiB"
    for i in (0, 23):  # HYBRID written without a consumer: all there
        cfg = client_config(svc, exchange=f"rss-h{i}")
        assert sum(b.num_rows for b in ex.read_subpartition(cfg, ex.describe_exchange(cfg), 0)) == rows_each


def _register_many(client: RawClient, names: list[str], ptype: str) -> dict[str, int]:
    for name in names:
        client.send(RegisterPartition(name, 1, ptype, "", "", 4096, 4))
    handles = {}
    while len(handles) < len(names):
        msg = client.next()
        if isinstance(msg, PartitionRegistered):
            handles[msg.partition] = msg.handle
        else:
            assert isinstance(msg, ProducerCredit), msg
    return handles


def test_fds_stay_bounded_with_5000_finished_hybrid_partitions(tmp_service):
    """A finished partition's data file is closed; reads go through an LRU of maxOpenSpillFiles fds."""
    bound = 64
    svc = tmp_service(conf={"maxOpenSpillFiles": bound})
    start_fds = fd_count(svc.proc.pid)
    client = RawClient(svc)
    names = [f"fd-{i}" for i in range(5000)]
    payload = {name: pa.record_batch([pa.array([i])], names=["v"]).serialize().to_pybytes()
               for i, name in enumerate(names)}
    peak = 0
    for start in range(0, len(names), 500):
        wave = names[start:start + 500]
        handles = _register_many(client, wave, "HYBRID")
        for name in wave:
            client.send(PushBuffer(handles[name], 0, BufferKind.DATA, 0, payload[name]))
            client.send(FinishPartition(handles[name]))
        done = 0
        while done < len(wave):
            msg = client.next()
            assert not isinstance(msg, ErrorResponse), msg.message
            done += isinstance(msg, PartitionFinished)
        peak = max(peak, fd_count(svc.proc.pid))
    # reading 300 different finished partitions cycles the LRU
    reader = RawClient(svc)
    for rid, name in enumerate(names[::16][:300]):
        reader.send(PartitionRequest(name, 0, rid, 2))
        msg = reader.next()
        assert isinstance(msg, BufferResponse) and bytes(msg.payload) == payload[name], name
        assert reader.next().kind == BufferKind.END_OF_PARTITION
    peak = max(peak, fd_count(svc.proc.pid))
    status = svc.status()
    assert len(status["partitions"]) == 5000
    assert status["memory"]["open_spill_reads"] <= bound
    # the partitions' data files add at most the LRU's bound (a file per partition would be 5,000)
    assert peak <= start_fds + bound + 8, (start_fds, peak)
    healthy(svc)


def test_bounded_writer_waits_for_memory_and_proceeds_when_a_consumer_frees_it(tmp_service):
    """Budget of 4 slots: partition A fills it and finishes unread; B registers (never refused), gets no
    credit while A holds everything, and gets credit as soon as A's consumer takes a buffer."""
    svc = tmp_service(conf={"memory.budget": 4 * 4096})
    a = RawClient(svc)
    a.send(RegisterPartition("mem-a", 1, "PIPELINED_BOUNDED", "", "", 4096, 4))
    assert isinstance(a.next(), PartitionRegistered)
    credit = a.next()
    assert isinstance(credit, ProducerCredit) and credit.credit == 4  # alone: its whole maximum
    payloads = [bytes([i]) * 1000 for i in range(4)]
    for p in payloads:
        a.send(PushBuffer(1, 0, BufferKind.DATA, 0, p))
    a.send(FinishPartition(1))
    assert isinstance(a.next(), PartitionFinished)
    b = RawClient(svc)
    b.send(RegisterPartition("mem-b", 1, "PIPELINED_BOUNDED", "", "", 4096, 4))
    assert isinstance(b.next(), PartitionRegistered)
    with pytest.raises(TimeoutError):
        b.next(0.7)  # A holds the whole budget: B waits (backpressure, not a refusal)
    assert svc.status()["memory"]["used"] == 4 * 4096
    reader = RawClient(svc)
    reader.send(PartitionRequest("mem-a", 0, 1, 1))  # one buffer of A is taken: one slot's memory is free
    assert bytes(reader.next().payload) == payloads[0]
    got = b.next(5)
    assert isinstance(got, ProducerCredit) and got.credit == 1
    b.send(PushBuffer(1, 0, BufferKind.DATA, 0, b"from b"))
    reader.send(PartitionRequest("mem-b", 0, 2, 4))
    msg = reader.next()
    assert (msg.receiver_id, bytes(msg.payload)) == (2, b"from b")
    memory = svc.status()["memory"]  # the most held or promised at once: the whole budget, never more
    assert memory["peak_reserved"] == memory["budget"] == 4 * 4096 >= memory["reserved"]
    assert memory["peak_used"] == 4 * 4096  # A's four buffers held at once


def test_buffer_costs_its_real_size_and_only_one_beyond_the_budget_is_refused(tmp_service):
    svc = tmp_service(conf={"memory.budget": 4 * 4096})
    client = RawClient(svc)
    client.send(RegisterPartition("big", 1, "PIPELINED_BOUNDED", "", "", 4096, 4))
    client.next()
    client.next()
    client.send(PushBuffer(1, 0, BufferKind.DATA, 0, b"x" * 10_000))  # a huge row: one buffer, 10 kB
    client.send(PushBuffer(1, 0, BufferKind.DATA, 0, b"y" * 20_000))  # more than the whole budget
    error = client.next()
    assert isinstance(error, ErrorResponse) and not error.fatal
    assert "cannot fit memory.budget" in error.message, error.message
    time.sleep(0.2)
    part = svc.status()["partitions"][0]
    assert part["pool_bytes"] == 10_000 and part["pool_used"] == 1
    # HYBRID: the same buffer simply goes to disk
    client.send(RegisterPartition("big-hybrid", 1, "HYBRID", "", "", 4096, 4))
    registered = [m for m in (client.next(), client.next()) if isinstance(m, PartitionRegistered)]
    client.send(PushBuffer(registered[0].handle, 0, BufferKind.DATA, 0, b"z" * 20_000))
    client.send(FinishPartition(registered[0].handle))
    while not isinstance(client.next(), PartitionFinished):
        pass
    reader = RawClient(svc)
    reader.send(PartitionRequest("big-hybrid", 0, 1, 2))
    assert bytes(reader.next().payload) == b"z" * 20_000
    healthy(svc)


@pytest.mark.spark
def test_spark_default_settings_local2_two_exchanges_of_200_producers_by_16_alive_at_once(tmp_path):
    """Wide exchanges as a user meets them, in its own application (``local[2]``, default settings,
    its own embedded service): two exchanges of 200 write tasks x 16 subpartitions alive together,
    each read back exactly (chispa, placement included): more partitions than a 1 GiB budget has room for
    at 16 MiB each. (1,000 producers x 4: test_a_thousand_producers_of_four_subpartitions.)"""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from harness import stop_embedded

    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).parent / "app_default_width.py")],
                              capture_output=True, text=True, timeout=600, env=env)
    finally:
        stop_embedded(tmp_path / "runtime")  # it keeps the application's exchanges for later readers
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["alive_together"]) == 2, report["alive_together"]
    for i in range(2):
        assert report["alive_together"][f"width-200x16-{i}"] == {"producers": 200, "width": 16, "sealed": True,
                                                                 "rows": 64_000}
        assert report["exchanges"][f"width-200x16-{i}"] == 64_000


def test_hybrid_writer_on_the_service_host_with_no_memory_free_goes_to_disk(tmp_service):
    """A budget of one slot, all of it set aside for the running writer's frame in flight: every HYBRID
    buffer written into a shared slot goes to the spill file only, its slot comes straight back (the
    writer never waits), and both reads are exact."""
    from test_shared_memory import write_and_read

    from sparkflow_exchange.partition import shared_arena

    if not shared_arena.available():
        pytest.skip("no writable /dev/shm")
    svc = tmp_service(conf={"memory.budget": "64k"})
    state, _ = write_and_read(svc, "HYBRID", reads=2, rows=50_000)
    writer = state["writer"]
    assert writer.arena is not None and writer.buffers_shared == writer.buffers_pushed > writer.arena.slots
    assert svc.status()["memory"]["used"] == 0
