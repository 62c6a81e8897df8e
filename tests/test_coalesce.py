"""Coalesced reads without Spark: the coalescing rule, the width fixed by the first producer, range reads
over the service and from spill files, read plans of sealed exchanges, and notifications as deltas."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer_kinds import END_COUNTS, BufferKind
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.consumer.read_plan import ReadRange, SkewRule, coalesce, plan_ranges, skewed_subpartitions
from sparkflow_exchange.consumer.read_plan import read_ranges as plan_of
from sparkflow_exchange.description import ExchangeDescription
from sparkflow_exchange.errors import ErrorCode, ExchangeReadError
from sparkflow_exchange.network.protocol import ErrorResponse, Notify, PartitionRequest
from sparkflow_exchange.partition.buffer_pool import MemoryBudget
from sparkflow_exchange.partition.range_view import RangeView, SubpartitionRangeError
from sparkflow_exchange.partition.result_partition import ResultPartition
from sparkflow_exchange.writer.selectors import make_selector


def described(**fields) -> ExchangeDescription:
    """A description as the coordinator would send it, with these fields."""
    return ExchangeDescription.parse({"name": "x", "schema": "", "partition_type": "HYBRID", "state": "committed",
                                      **fields})


def read_ranges(fields: dict, advisory):
    return [(r.start, r.end) for r in plan_of(described(**fields), advisory)]

SCHEMA = pa.schema([pa.field("key", pa.int64(), nullable=False), pa.field("producer", pa.int32(), nullable=False)])


def batches(producer: int, rows: int) -> list[pa.RecordBatch]:
    key = np.arange(rows, dtype=np.int64) * 31 + producer
    return [pa.record_batch([pa.array(key[i:i + 1000]), pa.array(np.full(len(key[i:i + 1000]), producer, np.int32))],
                            schema=SCHEMA) for i in range(0, rows, 1000)]


def subpartition_of(keys: np.ndarray, n: int) -> np.ndarray:
    batch = pa.record_batch([pa.array(keys), pa.array(np.zeros(len(keys), np.int32))], schema=SCHEMA)
    return make_selector("hash", n, 0, SCHEMA, keys=("key",)).select(batch)


def write(config, producers: int, rows: int, width: int | None = None, commit: bool = True) -> wh.WriteHandle:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    done = []
    for p in range(producers):
        task = ex.ProducerTask(handle, p, f"a{p}", num_subpartitions=width)
        task.write(batches(p, rows))
        done.append(task.finish()["partition"])
    if commit:
        wh.commit_write(handle, done)
    return handle


def keys_read(config, desc, start: int, end: int | None = None) -> list[int]:
    return sorted(k for b in ex.read_subpartition(config, desc, start, end) for k in b.column("key").to_pylist())


# ------------------------------------------------------------------ the rule
def test_coalesce_packs_adjacent_subpartitions_up_to_the_target():
    assert coalesce([10] * 20, 35) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18), (18, 20)]
    assert coalesce([1] * 200, 64 << 20) == [(0, 200)]  # small: one read partition
    assert coalesce([0] * 5, 10) == [(0, 5)]  # empty: still one, covering everything
    assert coalesce([100, 1, 1, 100], 50) == [(0, 1), (1, 3), (3, 4)]  # oversized ones stand alone
    assert coalesce([30, 30, 30, 5], 60) == [(0, 2), (2, 4)]  # a tiny tail joins its neighbour (Spark's 20%/120%)
    for sizes in (np.random.default_rng(1).integers(0, 100, 300).tolist(), [0, 0, 7, 0, 0]):
        ranges = coalesce(sizes, 150)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(sizes)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, every subpartition once


def test_explicit_width_or_unsealed_means_one_read_partition_per_subpartition():
    sizes = [1] * 8
    base = {"num_subpartitions": 8, "subpartition_bytes": sizes}
    assert read_ranges({**base, "coalesce": True, "sealed": True}, 100) == [(0, 8)]
    assert read_ranges({**base, "coalesce": False, "sealed": True}, 100) == [(i, i + 1) for i in range(8)]
    assert read_ranges({**base, "coalesce": True, "sealed": False}, 100) == [(i, i + 1) for i in range(8)]
    assert read_ranges({**base, "coalesce": True, "sealed": True, "subpartition_bytes": None}, 100) == \
        [(i, i + 1) for i in range(8)]


def test_skewed_subpartitions_stand_alone_and_split_into_ranges_of_producers():
    rule = SkewRule(factor=5.0, threshold=100)
    sizes = [10, 10, 1000, 10, 10, 10, 10, 450]
    assert skewed_subpartitions(sizes, rule) == [2, 7]  # above max(100, 5 x median 10)
    assert skewed_subpartitions(sizes, SkewRule(5.0, 1000)) == []  # the threshold decides too
    ranges = plan_ranges(sizes, 100, producers=8, rule=rule)
    assert ranges == [ReadRange(0, 2), *[ReadRange(2, 3, (i, i + 1)) for i in range(8)],  # 1000 / 100: at most 8
                      ReadRange(3, 7), *[ReadRange(7, 8, r) for r in ((0, 2), (2, 3), (3, 5), (5, 6), (6, 8))]]  # 450/100
    assert plan_ranges(sizes, 100, producers=8, rule=None) == [ReadRange(s, e) for s, e in coalesce(sizes, 100)]
    # every (subpartition, producer) pair is read exactly once, whatever the shape
    rng = np.random.default_rng(3)
    for _ in range(50):
        sizes = rng.integers(0, 50, rng.integers(1, 40)).tolist()
        for i in rng.integers(0, len(sizes), 3):
            sizes[i] = int(rng.integers(200, 5000))
        producers = int(rng.integers(1, 30))
        cover = np.zeros((len(sizes), producers), np.int64)
        for r in plan_ranges(sizes, 100, producers, SkewRule(2.0, 150)):
            a, b = r.producers or (0, producers)
            cover[r.start:r.end, a:b] += 1
        assert (cover == 1).all()
    desc = described(num_subpartitions=3, subpartition_bytes=[1, 1, 9000], coalesce=True, sealed=True,
                     committed=["p0", "p1", "p2"])
    assert plan_of(desc, 100, rule) == [ReadRange(0, 2), ReadRange(2, 3, (0, 1)), ReadRange(2, 3, (1, 2)),
                                        ReadRange(2, 3, (2, 3))]
    assert plan_of(desc.replace(committed=("p0",)), 100, rule) == [ReadRange(0, 2), ReadRange(2, 3)]  # one producer
    assert plan_of(desc.replace(coalesce=False), 100, rule) == [ReadRange(i, i + 1) for i in range(3)]


@pytest.mark.parametrize("host", ["hostA", "hostB"])  # spill files on this host; the network from another
def test_a_range_of_producers_reads_their_rows_only(tmp_service, host):
    svc = tmp_service(host_id="hostA")
    base = dict(exchange=f"producer-range-{host}", partitioner="hash", keys="key", bufferSize="4k",
                partitionType="BLOCKING")
    write(client_config(svc, hostId="hostA", **base), 5, 2000, width=4)
    config = client_config(svc, hostId=host, **base)
    desc = ex.describe_exchange(config)
    order = [int(p["index"]) for p in desc.sealed_producers()]  # commit order
    got = {}
    for first, last in ((0, 2), (2, 3), (3, 5)):
        batches_read = list(ex.read_subpartition(config, desc, 1, producers=(first, last)))
        got[(first, last)] = sorted(set(b.column("producer").to_pylist()[0] for b in batches_read if b.num_rows))
        assert got[(first, last)] == sorted(order[first:last])
    union = sorted(k for r in ((0, 2), (2, 3), (3, 5))
                   for b in ex.read_subpartition(config, desc, 1, producers=r) for k in b.column("key").to_pylist())
    assert union == keys_read(config, desc, 1)
    for bad in ((2, 2), (0, 6), (-1, 1)):
        with pytest.raises(ex.ExchangeError, match=r"bad producer range"):
            list(ex.read_subpartition(config, desc, 1, producers=bad))


# ------------------------------------------------------------------ range view on a partition
def test_range_view_reads_subpartitions_in_order_and_resumes_across_them(tmp_path):
    part = ResultPartition("p", 4, "HYBRID", MemoryBudget(1 << 20), 4, 1024, tmp_path)
    for sub in range(4):
        for i in range(sub):  # subpartition 0 is empty
            part.add(sub, BufferKind.DATA, 0, f"s{sub}-{i}".encode())
    with pytest.raises(SubpartitionRangeError, match="finished"):
        RangeView(part, 0, 2, 0, lambda: None)
    part.finish()

    def take_all(view):
        out = []
        while view.next_is_event() is not None:
            item, seq, backlog = view.take()
            out.append((bytes(item.payload), seq, backlog, item.kind))
            if item.kind == BufferKind.END_OF_PARTITION:
                break
        return out

    got = take_all(RangeView(part, 0, 4, 0, lambda: None))
    assert [p for p, *_ in got] == [b"s1-0", b"s2-0", b"s2-1", b"s3-0", b"s3-1", b"s3-2",
                                    END_COUNTS.pack(6, -1)]  # the closing end carries the range's counts
    assert [s for _, s, _, _ in got] == list(range(7))  # one sequence across the range
    assert [b for _, _, b, _ in got][:6] == [5, 4, 3, 2, 1, 0]  # backlog counts the rest of the range
    assert [k for *_, k in got].count(BufferKind.END_OF_PARTITION) == 1
    resumed = take_all(RangeView(part, 1, 4, 3, lambda: None))  # position 3 of [1, 4) is s3-0
    assert [p for p, *_ in resumed] == [b"s3-0", b"s3-1", b"s3-2", END_COUNTS.pack(6, -1)] and resumed[0][1] == 3
    for start, end in ((2, 2), (3, 1), (0, 5), (-1, 2)):
        with pytest.raises(SubpartitionRangeError, match="outside"):
            RangeView(part, start, end, 0, lambda: None)
    with pytest.raises(SubpartitionRangeError, match="resume position 9"):
        RangeView(part, 0, 4, 9, lambda: None)


# ------------------------------------------------------------------ width
def test_width_is_fixed_by_the_first_producer_and_another_is_refused(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="width", partitioner="hash", keys="key", declareTimeout="0.3s")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    assert handle.width_open
    with pytest.raises(ex.ExchangeError, match="first write task fixes it.*spark.sql.shuffle.partitions"):
        ex.describe_exchange(config)  # no producer yet: the width is unknown, the read waits, then says why
    first = ex.ProducerTask(handle, 0, "a0", num_subpartitions=7)
    assert ex.describe_exchange(config).num_subpartitions == 7
    with pytest.raises(ex.ExchangeError, match="has 7 subpartitions .* this producer writes 9"):
        ex.ProducerTask(handle, 1, "a1", num_subpartitions=9)
    assert not any(p["partition"].startswith("width.") and ".1.a1." in p["partition"]
                   for p in svc.status()["partitions"])  # the refused partition was released
    first.write(batches(0, 100))
    wh.commit_write(handle, [first.finish()["partition"]])
    desc = ex.describe_exchange(config)
    assert desc.coalesce and desc.sealed and len(desc.subpartition_bytes) == 7
    assert sum(desc.subpartition_bytes) > 0


def test_reader_planned_before_the_first_producer_waits_for_the_width(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="wait-width", partitioner="hash", keys="key",
                           declareTimeout="20s")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    threading.Timer(0.5, lambda: ex.ProducerTask(handle, 0, "a0", num_subpartitions=5)).start()
    start = time.monotonic()
    assert ex.describe_exchange(config).num_subpartitions == 5
    assert 0.4 < time.monotonic() - start < 10


# ------------------------------------------------------------------ range reads
@pytest.mark.parametrize("partition_type", ["HYBRID", "BLOCKING"])
def test_range_read_over_the_service_and_from_spill_files(tmp_service, partition_type):
    svc = tmp_service(host_id="hostA")
    n, producers, rows = 6, 3, 3000
    base = dict(exchange=f"range-{partition_type}", partitioner="hash", keys="key", numSubpartitions=n,
                partitionType=partition_type, bufferSize="4k")
    write(client_config(svc, hostId="hostA", **base), producers, rows)
    all_keys = np.concatenate([np.arange(rows, dtype=np.int64) * 31 + p for p in range(producers)])
    subs = subpartition_of(all_keys, n)
    for host, via_network in (("hostB", True), ("hostA", False)):  # another host: TCP; this host: spill files
        config = client_config(svc, hostId=host, **base)
        desc = ex.describe_exchange(config)
        before = svc.status()["traffic"]
        got = keys_read(config, desc, 1, 4)
        assert got == sorted(all_keys[(subs >= 1) & (subs < 4)].tolist())
        after = svc.status()["traffic"]
        served = after["local"] + after["remote"] - before["local"] - before["remote"]
        assert (served > 0) == via_network
        assert keys_read(config, desc, 0, n) == sorted(all_keys.tolist())
    with pytest.raises(ex.ExchangeError, match=r"bad subpartition range \[3, 3\)"):
        ex.read_subpartition(config, desc, 3, 3)
    with pytest.raises(ex.ExchangeError, match=r"bad subpartition range \[2, 7\)"):
        ex.read_subpartition(config, desc, 2, 7)


def test_service_refuses_bad_ranges_with_a_named_error(tmp_service):
    svc = tmp_service(host_id="hostA")
    base = dict(exchange="bad-range", partitioner="hash", keys="key", numSubpartitions=4)
    write(client_config(svc, hostId="hostA", **base), 1, 500)
    desc = ex.describe_exchange(client_config(svc, hostId="hostB", **base))
    partition = desc.committed[0]
    with svc.connect(host_id="hostB") as conn:
        for rid, (start, end) in enumerate(((2, 2), (3, 1), (0, 5), (4, 6)), start=1):
            conn.send(PartitionRequest(partition, start, rid, 2, 0, False, end))
            msg = conn.recv(5)
            assert isinstance(msg, ErrorResponse) and msg.receiver_id == rid, msg
            assert msg.code == ErrorCode.BAD_REQUEST and f"[{start}, {end})" in msg.message


# ------------------------------------------------------------------ plans and notifications
def test_sealed_read_plan_reads_without_the_coordinator(tmp_service):
    coord = tmp_service(host_id="hostA")
    other = tmp_service(host="127.0.0.2", host_id="hostB", coordinator=False, conf={"coordinator": coord.tcp})
    base = dict(exchange="plan", partitioner="hash", keys="key", numSubpartitions=3)
    write(client_config(coord, service=other.tcp, hostId="hostB", **base), 2, 1000)
    desc = ex.describe_exchange(client_config(coord, hostId="hostA", **base))
    assert desc.sealed_producers() and all(p["location"]["host_id"] == "hostB" for p in desc.sealed_producers())
    # a reader whose coordinator address is dead still reads: the plan names every producer and its service
    dead = ExchangeConfig.load({"coordinator": "127.0.0.1:1", "service": other.tcp, "secret": coord.secret,
                                "hostId": "hostC", **base}, spark_conf={})
    got = sorted(k for s in range(3) for b in ex.read_subpartition(dead, desc, s) for k in b.column("key").to_pylist())
    assert got == sorted(np.concatenate([np.arange(1000) * 31 + p for p in range(2)]).tolist())


def test_notifications_are_full_state_then_deltas_and_a_late_gate_sees_every_producer(tmp_service):
    svc = tmp_service(host_id="hostA")
    base = dict(exchange="deltas", partitioner="hash", keys="key", numSubpartitions=2, partitionType="HYBRID")
    config = client_config(svc, hostId="hostB", **base)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    finished = []
    for p in range(2):  # two producers registered and finished before anyone reads
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write(batches(p, 500))
        finished.append(task.finish()["partition"])
    with svc.connect() as watcher:
        watcher.call("subscribe", name="deltas", topic="t")
        desc = ex.describe_exchange(config)
        assert not desc.sealed
        result: dict = {}
        reader = threading.Thread(target=lambda: result.update(keys=keys_read(config, desc, 0) + keys_read(config, desc, 1)))
        reader.start()
        for p in range(2, 4):  # two more register and finish while the gate is subscribed
            task = ex.ProducerTask(handle, p, f"a{p}")
            task.write(batches(p, 500))
            finished.append(task.finish()["partition"])
        wh.commit_write(handle, finished)
        reader.join(30)
        assert not reader.is_alive()
        notes = [m.body for m in watcher.poll() if isinstance(m, Notify)]
    assert sorted(result["keys"]) == sorted(np.concatenate([np.arange(500) * 31 + p for p in range(4)]).tolist())
    assert notes[0].get("full") and len(notes[0]["producers"]) == 2  # the state at subscribe
    deltas = notes[1:]
    assert deltas and all(not d.get("full") and len(d["producers"]) <= 1 for d in deltas)
    assert [d["producers"][0]["state"] for d in deltas if d["producers"]] == ["running", "finished"] * 2
    assert deltas[-1]["sealed"] and deltas[-1]["committed"] == finished


def test_read_plan_of_a_dropped_exchange_fails_naming_why(tmp_service):
    svc = tmp_service(host_id="hostA")
    base = dict(exchange="plan-dropped", partitioner="hash", keys="key", numSubpartitions=2)
    write(client_config(svc, hostId="hostA", **base), 1, 500)
    config = client_config(svc, hostId="hostB", **base)  # another host: through the service, not the spill file
    desc = ex.describe_exchange(config)
    ex.drop_exchange("plan-dropped", config)
    deadline = time.monotonic() + 5
    while svc.status()["partitions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ExchangeReadError, match="dropped or overwritten after this read was planned"):
        keys_read(config, desc, 0)


def test_forward_producers_with_a_given_width_finish_without_per_subpartition_sizes(tmp_service):
    """A forward producer writes one subpartition of its own: its size list does not match the width."""
    svc = tmp_service(host_id="hostA")
    base = dict(exchange="fwd-sizes", partitioner="forward", numSubpartitions=2)
    config = client_config(svc, hostId="hostA", **base)
    write(config, 2, 300)
    desc = ex.describe_exchange(config)
    assert desc.sealed and desc.subpartition_bytes is None and not desc.coalesce
    assert keys_read(config, desc, 1) == sorted((np.arange(300) * 31 + 1).tolist())


def test_a_read_plan_carries_each_service_location_once_and_only_what_gates_read():
    import pickle

    from sparkflow_exchange.consumer.read_plan import GATE_FIELDS, compact_producers

    def location(n: int) -> dict:  # as the coordinator's JSON gives them: a new dict per producer
        return {"tcp": f"127.0.0.{n}:4000", "unix": f"unix:/tmp/s{n}.sock", "host_id": f"h{n}", "pid": 100 + n}

    producers = [{"index": i, "attempt": f"{i}-0-{i}", "partition": f"x.1.{i}", "location": location(i % 2),
                  "write_id": "w1", "state": "finished", "reason": "", "spill": f"/spill/x.1.{i}.data",
                  "rows": 1000, "bytes": 40000, "failed_over": 0,
                  # a partition's copies travel with it (a gate goes on from them); none: nothing to carry
                  "replicas": [{"location": location(2), "state": "complete"}] if i % 50 == 0 else []}
                 for i in range(200)]
    compact = compact_producers(producers)
    assert [set(p) for p in compact] == [set(GATE_FIELDS) - (set() if p["replicas"] else {"replicas"})
                                         for p in producers]
    assert all(c[k] == p[k] for c, p in zip(compact, producers) for k in GATE_FIELDS if k in c)
    assert len({id(p["location"]) for p in compact}) == 2  # one object per service: pickled once each
    assert len(pickle.dumps(compact)) < len(pickle.dumps(producers)) / 2
