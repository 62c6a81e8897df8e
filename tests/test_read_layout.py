"""Reads laid out to the reading application's task slots (consumer/read_plan.py, docs/batch-guide.md, "Width:
exact or coalesced"), and a gate reading several subpartitions of every producer at once.

A read planned while its exchange is written runs in m = min(slots, n) read partitions (for a hash exchange written
with numSubpartitions the largest divisor of n within the slots), partition j reading subpartitions j, j + m, ...:
every read task can run while the producers write. Against real services: rows arrive before the producers finish,
every row once, the rows of read partition j exactly those ``repartition(m, key)`` puts in j, and the guarantees
of one channel per producer still hold with one channel per (producer, subpartition).
"""
from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ConfigError
from sparkflow_exchange.consumer.input_gate import InputGate
from sparkflow_exchange.consumer.read_plan import read_ranges
from sparkflow_exchange.description import ExchangeDescription
from sparkflow_exchange.errors import ExchangeReadError
from sparkflow_exchange.writer.selectors import make_selector

SCHEMA = pa.schema([pa.field("key", pa.int64(), nullable=False), pa.field("producer", pa.int32(), nullable=False)])
QUICK = 15.0  # what "while the producer writes" waits at most, generously
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns() % 10**6}"


def described(**fields) -> ExchangeDescription:
    return ExchangeDescription.parse({"name": "ex", "schema": "", "partition_type": "HYBRID", "state": "open", **fields})


def layout(n: int, requested: str = "auto", *, slots: int | None = None, sealed: bool = False,
           partitioner: str = "hash", coalesce: bool = False) -> list[list[int]]:
    desc = described(num_subpartitions=n, sealed=sealed, coalesce=coalesce, partitioner={"name": partitioner})
    return [list(r.subpartitions()) for r in read_ranges(desc, 1 << 30, slots=slots, requested=requested)]


def batch(keys: np.ndarray, producer: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(keys), pa.array(np.full(len(keys), producer, np.int32))], schema=SCHEMA)


def subpartition_of(keys: np.ndarray, n: int) -> np.ndarray:
    return make_selector("hash", n, 0, SCHEMA, keys=("key",)).select(batch(keys, 0))


# ------------------------------------------------------------------ the rule (the JVM reader's: test_jvm_units.py)
def test_a_read_while_written_is_laid_out_to_the_slots_and_a_number_wins():
    assert layout(200, slots=3) == [list(range(0, 200, 2)), list(range(1, 200, 2))]  # 2: largest divisor within 3
    assert layout(200, slots=8) == [list(range(j, 200, 8)) for j in range(8)]
    assert layout(7, slots=2) == [list(range(7))]  # 7 is prime: one key-grouped partition
    assert layout(7, slots=2, coalesce=True) == [[0, 2, 4, 6], [1, 3, 5]]  # not key-grouped: min(slots, n)
    assert layout(7, slots=2, partitioner="rebalance") == [[0, 2, 4, 6], [1, 3, 5]]
    assert layout(4, slots=16) == [[0], [1], [2], [3]]  # never more than n
    assert layout(8, "4", slots=2) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # a number, not the slots
    assert layout(8, " 2 ", sealed=True) == [[0, 2, 4, 6], [1, 3, 5, 7]]  # a number applies to a sealed read too
    assert layout(8, slots=2, sealed=True) == [[i] for i in range(8)]  # sealed, auto: as written
    assert layout(4, slots=2, partitioner="broadcast") == [[0], [1], [2], [3]]  # one read partition per copy
    assert layout(4, "2", partitioner="broadcast") == [[0], [1]]


@pytest.mark.parametrize(("n", "requested", "extra", "message"), [
    (8, "3", {}, "readPartitions=3 for exchange 'ex' of 8 subpartitions: give a divisor of 8 (each read partition "
                 "then holds whole buckets)"),
    (8, "9", {"coalesce": True}, "readPartitions=9 for exchange 'ex' of 8 subpartitions: give a number from 1 to 8"),
    (8, "0", {"coalesce": True}, "readPartitions=0 for exchange 'ex' of 8 subpartitions: give a number from 1 to 8"),
    (8, "many", {}, "readPartitions of exchange 'ex' must be auto or a number of read partitions, got 'many'"),
    (4, "5", {"partitioner": "broadcast"}, "readPartitions=5 for broadcast exchange 'ex' of 4 copies: give a number "
                                           "from 1 to 4 (each read partition reads one copy)"),
])
def test_a_bad_read_partitions_names_the_option_and_what_to_give(n, requested, extra, message):
    with pytest.raises(ConfigError) as refused:
        layout(n, requested, slots=2, **extra)
    assert str(refused.value) == message


# ------------------------------------------------------------------ the gate: every subpartition at once
def _config(svc, name: str, partition_type: str, width: int, **kw):
    return client_config(svc, exchange=name, partitioner="hash", keys="key", numSubpartitions=width,
                         partitionType=partition_type, bufferSize="8k", bufferTimeout="10ms", readerTimeout="60s",
                         **kw)


class _Reader(threading.Thread):
    """One read task: its batches as they arrive (keys and the time each came), or its error."""

    def __init__(self, config, desc, index: int, stride: int) -> None:
        super().__init__(daemon=True)
        self.config, self.desc, self.index, self.stride = config, desc, index, stride
        self.keys: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            for b in ex.read_subpartition(self.config, self.desc, self.index, stride=self.stride):
                self.keys.append(b.column("key").to_numpy())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc

    def got(self) -> np.ndarray:
        return np.concatenate(self.keys) if self.keys else np.empty(0, np.int64)


@pytest.mark.parametrize("partition_type", ["HYBRID", "PIPELINED_BOUNDED"])
def test_each_read_task_takes_all_its_subpartitions_while_the_producers_write(tmp_service, partition_type):
    """Two producers still writing, 8 subpartitions read by 4 tasks (2 each): every task has rows of both of its
    subpartitions from both producers before either finished; after the commit every row arrived once, in the
    task whose subpartitions hold its key."""
    svc = tmp_service()
    width, m = 8, 4
    config = _config(svc, unique(f"live-{partition_type}"), partition_type, width, buffersPerPartition=4)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    tasks = [ex.ProducerTask(handle, p, f"a{p}") for p in range(2)]
    desc = ex.describe_exchange(config)
    assert not desc.sealed
    readers = [_Reader(config, desc, j, m) for j in range(m)]
    keys = [np.arange(p, 40_000, 2, dtype=np.int64) for p in range(2)]
    first = [k[:2_000] for k in keys]
    for task, part in zip(tasks, first):
        task.write([batch(part, 0)])
    wanted = {(j, sub) for j in range(m) for sub in range(j, width, m)}
    deadline = time.monotonic() + QUICK
    while time.monotonic() < deadline:
        seen = {(r.index, int(s)) for r in readers for s in np.unique(subpartition_of(r.got(), width))}
        if seen >= wanted:
            break
        time.sleep(0.05)
    assert seen >= wanted, f"before the producers finished, rows of only {sorted(seen)} arrived"
    assert not any(r.error for r in readers), [r.error for r in readers]
    for task, k in zip(tasks, keys):
        task.write([batch(k[2_000:], 0)])
    parts = [task.finish()["partition"] for task in tasks]
    wh.commit_write(handle, parts)
    for r in readers:
        r.join(60)
        assert not r.is_alive() and r.error is None, r.error
    everything = np.sort(np.concatenate(keys))
    assert np.array_equal(np.sort(np.concatenate([r.got() for r in readers])), everything)  # every row once
    for r in readers:
        assert set((subpartition_of(r.got(), width) % m).tolist()) == {r.index}


def test_an_attempt_that_loses_the_commit_after_giving_rows_fails_the_strided_read(tmp_service):
    svc = tmp_service()
    config = _config(svc, unique("lost-attempt"), "HYBRID", 4)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    loser = ex.ProducerTask(handle, 0, "a0")
    desc = ex.describe_exchange(config)
    reader = _Reader(config, desc, 0, 2)  # subpartitions 0 and 2
    loser.write([batch(np.arange(0, 4_000, dtype=np.int64), 0)])
    deadline = time.monotonic() + QUICK
    while not reader.keys and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reader.keys, "no rows arrived while the attempt wrote"
    winner = ex.ProducerTask(handle, 0, "b0")
    winner.write([batch(np.arange(0, 4_000, dtype=np.int64), 0)])
    winner_part = winner.finish()["partition"]
    loser.finish()
    wh.commit_write(handle, [winner_part])
    reader.join(60)
    assert isinstance(reader.error, ExchangeReadError), reader.error
    assert "must be retried to see each row once" in str(reader.error), reader.error


def test_a_strided_forward_read_takes_the_producers_of_its_indices(tmp_service):
    """forward: subpartition i is producer i's, so read partition j of m reads producers j, j + m, ..."""
    svc = tmp_service()
    config = client_config(svc, exchange=unique("forward-strided"), partitioner="forward", numSubpartitions=4,
                           bufferTimeout="10ms", readerTimeout="60s")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    tasks = [ex.ProducerTask(handle, p, f"a{p}") for p in range(4)]
    desc = ex.describe_exchange(config)
    readers = [_Reader(config, desc, j, 2) for j in range(2)]
    for p, task in enumerate(tasks):
        task.write([batch(np.arange(p * 1000, p * 1000 + 1000, dtype=np.int64), p)])
    wh.commit_write(handle, [task.finish()["partition"] for task in tasks])
    for r in readers:
        r.join(60)
        assert r.error is None, r.error
    assert [sorted(set((r.got() // 1000).tolist())) for r in readers] == [[0, 2], [1, 3]]


@pytest.mark.parametrize("where", ["local files", "channels"])
def test_a_sealed_strided_read_takes_every_subpartition_of_every_producer(tmp_service, where):
    """readPartitions=m of a sealed exchange: one channel per (producer, subpartition), on the local-file fast
    path (every producer a spill file of this host) as through the service."""
    svc = tmp_service(host_id="hostA")
    host = "hostA" if where == "local files" else "elsewhere"
    config = _config(svc, unique("sealed-strided"), "HYBRID", 6, hostId=host, service=svc.unix)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    keys = [np.arange(p, 9_000, 3, dtype=np.int64) for p in range(3)]
    done = {}
    for p, k in enumerate(keys):
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write([batch(k, p)])
        result = task.finish()
        done[result["partition"]] = result["rows"]
    wh.commit_write(handle, list(done), done)
    desc = ex.describe_exchange(config)
    got = []
    for j in range(3):
        plan = desc.sealed_producers()
        gate = InputGate(config, desc, j, svc.tcp, svc.secret, host, local_service=svc.unix, producers=plan,
                         stride=3)
        part = np.concatenate([b.column("key").to_numpy() for b in gate])
        stats = gate.stats()
        assert stats["path"] == where
        assert len(stats["channels"]) == 3 * 2  # 3 producers x subpartitions j and j + 3
        assert set((subpartition_of(part, 6) % 3).tolist()) == {j}
        got.append(part)
    assert np.array_equal(np.sort(np.concatenate(got)), np.sort(np.concatenate(keys)))


# ------------------------------------------------------------------ in Spark: a read planned while written
@pytest.mark.spark
@pytest.mark.parametrize(("width", "options", "expected"), [
    (8, {}, "slots"),  # the session's 4 slots: 4 divides 8
    (6, {}, 3),  # the largest divisor of 6 within 4 slots
    (8, {"readPartitions": "2"}, 2),
])
def test_spark_read_planned_while_written_runs_in_the_slots_as_repartition_would(spark, width, options, expected):
    """The read is planned while a slow producer writes; its read partitions are laid out to the session's
    slots (``register(spark)`` carries its defaultParallelism to planning), partition j holds exactly the rows
    Spark's own ``repartition(m, key)`` puts in partition j, and every row arrives once."""
    from pyspark.sql import functions as F

    import sparkflow_exchange
    from sparkflow_exchange.config import ExchangeConfig

    sparkflow_exchange.register(spark)
    m = spark.sparkContext.defaultParallelism if expected == "slots" else expected
    name = unique("spark-live")
    config = ExchangeConfig.load({"exchange": name, "partitioner": "hash", "keys": "key",
                                  "numSubpartitions": str(width), "bufferSize": "8k", "bufferTimeout": "10ms"})
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    keys = np.random.default_rng(7).integers(0, 1 << 40, 12_000).astype(np.int64)
    task.write([batch(keys[:4_000], 0)])
    reader = spark.read.format("pipelined").option("exchange", name)
    for key, value in options.items():
        reader = reader.option(key, value)
    rdd = reader.load().select("key", F.spark_partition_id().alias("part")).rdd  # planned now: the write is open
    assert rdd.getNumPartitions() == m

    def finish_slowly() -> None:
        time.sleep(2)  # the read tasks run meanwhile
        task.write([batch(keys[4_000:], 0)])
        wh.commit_write(handle, [task.finish()["partition"]])

    writer = threading.Thread(target=finish_slowly, daemon=True)
    writer.start()
    got = spark.createDataFrame(rdd.collect(), "key long, part int")
    writer.join(60)
    source = spark.createDataFrame(pa.table({"key": keys}).to_pandas())
    want = source.repartition(m, "key").select("key", F.spark_partition_id().alias("part"))
    assert_df_equality(got, want, ignore_row_order=True, ignore_nullable=True)
    ex.drop_exchange(name)
