"""The sort-based record writer (FLIP-148): regions, grouping, bounded memory, many subpartitions end to end."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import TRAILER_SIZE, BatchEncoder, Region, decode
from sparkflow_exchange.writer.selectors import SelectorError, group_by_target, make_selector

SCHEMA = pa.schema([pa.field("producer", pa.int32(), nullable=False), pa.field("seq", pa.int64(), nullable=False),
                    pa.field("key", pa.int64(), nullable=False), pa.field("pad", pa.string())])


def batches_of(producer: int, rows: int, batch_rows: int = 10_000) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, rows, batch_rows):
        seq = np.arange(start, min(start + batch_rows, rows), dtype=np.int64)
        key = (seq * 2654435761 + producer * 104729) % 1_000_003
        pad = pa.array(np.char.add("r", (seq % 97).astype(str)).tolist())  # variable width, a few bytes
        out.append(pa.record_batch([pa.array(np.full(len(seq), producer, np.int32)), pa.array(seq), pa.array(key), pad],
                                   schema=SCHEMA))
    return out


def expected_seqs(producer: int, batches: list[pa.RecordBatch], n: int) -> list[np.ndarray]:
    selector = make_selector("hash", n, producer, SCHEMA, keys=("key",))
    targets = np.concatenate([selector.select(b) for b in batches])
    seqs = np.concatenate([b.column("seq").to_numpy() for b in batches])
    order = np.argsort(targets, kind="stable")
    bounds = np.searchsorted(targets[order], np.arange(n + 1))
    return [seqs[order[bounds[s]:bounds[s + 1]]] for s in range(n)]


# ---------------------------------------------------------------- regions
@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_region_is_schema_then_sealed_pieces_and_every_piece_decodes_alone(compression):
    enc = BatchEncoder(SCHEMA, compression)
    parts = {sub: batches_of(sub, 50 + 30 * sub)[0] for sub in (3, 7, 11, 12)}
    region = Region(enc.schema_message, 1 << 20)
    for sub, part in parts.items():
        region.add(sub, enc.encode(part))
    payload = region.payload()
    assert len(payload) == region.nbytes
    pieces = region.pieces()
    assert [p[0] for p in pieces] == [3, 7, 11, 12]
    for sub, offset, length in pieces:
        assert offset % 8 == 0
        assert decode(memoryview(payload)[offset:offset + length], SCHEMA).equals(parts[sub])
    # the schema message first; each piece is its IPC message and checksum trailer, back to back
    assert payload[:len(enc.schema_message)] == enc.schema_message.to_pybytes()
    assert pieces[0][1] == len(enc.schema_message)
    assert all(a[1] + a[2] == b[1] for a, b in zip(pieces, pieces[1:]))
    for sub, offset, length in pieces:
        message = ipc.read_message(pa.py_buffer(payload[offset:offset + length - TRAILER_SIZE]))
        assert ipc.read_record_batch(message, SCHEMA).equals(parts[sub])
    # written into a slot it is the same bytes
    slot = bytearray(region.nbytes + 100)
    assert region.write_into(memoryview(slot)) == region.nbytes
    assert bytes(slot[:region.nbytes]) == payload


def test_region_refuses_what_exceeds_its_capacity():
    enc = BatchEncoder(SCHEMA)
    piece = enc.encode(batches_of(0, 1000)[0])
    region = Region(enc.schema_message, len(enc.schema_message) + len(piece) + 10)
    region.add(0, piece)
    assert not region.fits(len(piece))
    with pytest.raises(ValueError, match="does not fit the region"):
        region.add(1, piece)
    with pytest.raises(ValueError, match="does not fit"):
        region.write_into(memoryview(bytearray(10)))
    region.clear()
    assert len(region) == 0 and region.nbytes == len(enc.schema_message)


# ---------------------------------------------------------------- grouping
def test_group_by_target_keeps_rows_and_their_order_per_subpartition():
    n = 4000
    batches = batches_of(1, 35_000, batch_rows=7_000)
    selector = make_selector("hash", n, 1, SCHEMA, keys=("key",))
    targets = [selector.select(b) for b in batches]
    grouped, subs, starts, counts = group_by_target(batches, targets, n)
    assert grouped.num_rows == 35_000 and counts.sum() == 35_000
    assert list(subs) == sorted(subs) and len(set(subs.tolist())) == len(subs)
    want = expected_seqs(1, batches, n)
    seq = grouped.column("seq").to_numpy()
    for sub, start, count in zip(subs, starts, counts):
        assert np.array_equal(seq[start:start + count], want[sub])
    assert sum(len(w) > 0 for w in want) == len(subs)


def test_group_by_target_checks_targets():
    batches = batches_of(0, 100)
    with pytest.raises(SelectorError, match="out of range"):
        group_by_target(batches, [np.full(100, 5, np.int32)], 5)
    with pytest.raises(SelectorError, match="99 targets for a batch of 100 rows"):
        group_by_target(batches, [np.zeros(99, np.int32)], 5)
    one, subs, starts, counts = group_by_target(batches, [np.full(100, 2, np.int32)], 5)
    assert one is batches[0] and list(subs) == [2] and list(counts) == [100]


# ---------------------------------------------------------------- against the real service
def read_back(cfg, n: int) -> list[pa.Table]:
    desc = ex.describe_exchange(cfg)
    return [pa.Table.from_batches(list(ex.read_subpartition(cfg, desc, s)), schema=SCHEMA) for s in range(n)]


# every read task costs a connection and a describe (~30 ms): the widths keep the read-back under a minute
@pytest.mark.parametrize("partition_type,shared,n", [("HYBRID", True, 1000), ("HYBRID", False, 400),
                                                     ("BLOCKING", False, 400), ("PIPELINED_BOUNDED", True, 400),
                                                     ("HYBRID", True, 8)])
def test_many_subpartitions_bounded_sort_buffer_read_back_exactly(tmp_service, partition_type, shared, n):
    """2 producers x many subpartitions through a small sort buffer: many flushes, memory bounded, rows exact."""
    svc = tmp_service()
    rows, sort_buffer = 60_000, 512 << 10
    opts = dict(exchange=f"many-{partition_type}-{shared}", partitioner="hash", keys="key", numSubpartitions=n,
                partitionType=partition_type, sortBufferSize=sort_buffer, bufferSize="64k", bufferTimeout="0",
                sharedMemory=shared, service=svc.unix if shared else svc.tcp, hostId=svc.info["host_id"])
    if partition_type == "PIPELINED_BOUNDED":  # nobody reads while it is written: the pool holds it all
        opts["buffersPerPartition"] = 256
    cfg = client_config(svc, **opts)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    data = {p: batches_of(p, rows) for p in range(2)}
    partitions = []
    for p in range(2):
        task = ex.ProducerTask(handle, p, f"a{p}")
        assert (task.writer.arena is not None) == (shared and partition_type != "BLOCKING")
        task.write(data[p])
        records = task.records
        assert records.peak_held_bytes <= sort_buffer  # the writer's memory bound, whatever n is
        assert records.sorting == (n * (64 << 10) > sort_buffer)
        if records.sorting:
            assert records.sort_flushes >= 3
            # small runs were packed: a few pushes per flush, not one per subpartition
            assert task.writer.regions_pushed >= records.sort_flushes
            assert task.writer.buffers_pushed < n * records.sort_flushes / 20
        else:  # few subpartitions: whole buffers per subpartition, no regions
            assert task.writer.regions_pushed == 0 and records.peak_held_bytes > 0
        assert (task.writer.buffers_shared > 0) == (shared and partition_type != "BLOCKING")  # regions in slots
        partitions.append(task.finish()["partition"])
    wh.commit_write(handle, partitions)
    want = {p: expected_seqs(p, data[p], n) for p in range(2)}
    tables = read_back(cfg, n)
    assert sum(t.num_rows for t in tables) == 2 * rows
    for s, table in enumerate(tables):
        producer = table.column("producer").to_numpy()
        seq = table.column("seq").to_numpy()
        for p in range(2):
            assert np.array_equal(seq[producer == p], want[p][s]), f"subpartition {s}, producer {p}"
    ex.drop_exchange(cfg.exchange, cfg)


def test_sort_buffer_flushes_a_trickle_within_the_buffer_timeout(tmp_service):
    """A few hash-routed rows, far below sortBufferSize, reach a running reader before the writer finishes."""
    svc = tmp_service()
    cfg = client_config(svc, exchange="trickle-hash", partitioner="hash", keys="key", numSubpartitions=1000,
                        partitionType="PIPELINED_BOUNDED", bufferTimeout="50ms", hostId="elsewhere")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    batch = batches_of(0, 10)[0]
    target = int(make_selector("hash", 1000, 0, SCHEMA, keys=("key",)).select(batch)[0])
    arrived: list[float] = []

    def consume() -> None:
        desc = ex.describe_exchange(cfg)
        for _ in ex.read_subpartition(cfg, desc, target):
            arrived.append(time.monotonic())

    reader = threading.Thread(target=consume)
    reader.start()
    time.sleep(0.5)
    sent = time.monotonic()
    task.write([batch])
    deadline = time.monotonic() + 5
    while not arrived and time.monotonic() < deadline:
        time.sleep(0.01)
    assert arrived, "rows in the sort buffer never reached the running reader"
    assert arrived[0] - sent < 1.0
    wh.commit_write(handle, [task.finish()["partition"]])
    reader.join(10)
    assert not reader.is_alive()


def test_a_timed_flush_that_waited_does_not_hold_the_next_one_back(tmp_service):
    """A timed flush waits ten times what the last one cost in the flusher's CPU, not in wall time: a flush whose
    push waited a second (for credit, or for a core on a loaded machine) lets the next rows leave within
    bufferTimeout, not ten seconds later."""
    svc = tmp_service()
    cfg = client_config(svc, exchange="waited-flush", partitioner="hash", keys="key", numSubpartitions=1000,
                        partitionType="PIPELINED_BOUNDED", bufferTimeout="50ms", hostId="elsewhere")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    records = task.records
    assert records.sorting
    waits = [1.0]
    for name in ("push_encoded", "push_region"):  # the first push waits a second, as one held back by credit
        real = getattr(task.writer, name)

        def waiting(*args, _real=real, **kwargs):
            if waits:
                time.sleep(waits.pop())
            return _real(*args, **kwargs)

        setattr(task.writer, name, waiting)
    first, second = batches_of(0, 20, batch_rows=10)
    task.write([first])
    deadline = time.monotonic() + 30
    while (records.sort_flushes < 1 or waits) and time.monotonic() < deadline:  # counted, then its push began
        time.sleep(0.01)
    assert records.sort_flushes == 1 and not waits, "the first timed flush did not happen"
    with records._lock:  # the first flush is over (it holds the lock while it pushes)
        pass
    task.write([second])
    sent = time.monotonic()
    while records.sort_flushes < 2 and time.monotonic() - sent < 30:
        time.sleep(0.01)
    assert records.sort_flushes == 2
    assert time.monotonic() - sent < 4.0, "the flush after one that waited 1 s was held back ~10 s"
    wh.commit_write(handle, [task.finish()["partition"]])
    ex.drop_exchange(cfg.exchange, cfg)


@pytest.mark.parametrize("partition_type,shared", [("HYBRID", True), ("HYBRID", False), ("BLOCKING", False),
                                                   ("PIPELINED_BOUNDED", True)])
def test_4000_subpartitions_every_row_back_in_its_subpartition(tmp_service, partition_type, shared):
    """2 producers x 4,000 subpartitions: range reads of 100 subpartitions return every row exactly once, each in
    its producer's order within its subpartition; a sample of single subpartitions is exact."""
    svc = tmp_service()
    n, rows = 4000, 40_000
    opts = dict(exchange=f"w4000-{partition_type}-{shared}", partitioner="hash", keys="key", numSubpartitions=n,
                partitionType=partition_type, sortBufferSize="512k", bufferSize="64k", bufferTimeout="0",
                sharedMemory=shared, service=svc.unix if shared else svc.tcp, hostId=svc.info["host_id"],
                buffersPerPartition=256)
    cfg = client_config(svc, **opts)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    data = {p: batches_of(p, rows) for p in range(2)}
    partitions = []
    for p in range(2):
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write(data[p])
        assert task.records.sorting and task.writer.regions_pushed > 0
        partitions.append(task.finish()["partition"])
    wh.commit_write(handle, partitions)
    want = {p: expected_seqs(p, data[p], n) for p in range(2)}
    selector = make_selector("hash", n, 0, SCHEMA, keys=("key",))
    desc = ex.describe_exchange(cfg)
    total = 0
    for start in range(0, n, 100):
        table = pa.Table.from_batches(list(ex.read_subpartition(cfg, desc, start, start + 100)), schema=SCHEMA)
        total += table.num_rows
        subs = np.concatenate([selector.select(b) for b in table.to_batches()]) if table.num_rows else np.zeros(0)
        assert ((subs >= start) & (subs < start + 100)).all()
        producer, seq = table.column("producer").to_numpy(), table.column("seq").to_numpy()
        for s in range(start, start + 100):
            for p in range(2):
                assert np.array_equal(seq[(subs == s) & (producer == p)], want[p][s]), f"subpartition {s}, producer {p}"
    assert total == 2 * rows
    # single-subpartition reads: rows exactly where the selector sent them (a bounded partition is consumed)
    for s in range(0, n, 97) if partition_type != "PIPELINED_BOUNDED" else ():
        table = pa.Table.from_batches(list(ex.read_subpartition(cfg, desc, s)), schema=SCHEMA)
        producer, seq = table.column("producer").to_numpy(), table.column("seq").to_numpy()
        for p in range(2):
            assert np.array_equal(seq[producer == p], want[p][s])
    ex.drop_exchange(cfg.exchange, cfg)
