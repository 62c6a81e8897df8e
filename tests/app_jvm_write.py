"""A Spark application writing exchanges through the JVM catalog (``df.writeTo("exchange.<name>")``), run by
tests/test_jvm_write.py with the plugin jar as argv[1].

First, while no Python data source has run in it: a JVM write and a JVM read, then the same through
``format("pipelined")`` (which the jar routes to the JVM path), watched for Python workers (Spark's own table of
worker factories, and the JVM's child processes, sampled throughout). Then the checks comparing JVM writes with the
source rows, with ``repartition``'s placement and with the Python writer, read by every reader. The session sets
``spark.sparkflow.exchange.jvmFormat=false`` so that ``format("pipelined")`` is the Python data source, the reference,
except in the checks of the routing, which turn it on.
Prints one JSON line: check name -> {"ok": bool, "error": text, ...details}.
"""
from __future__ import annotations

import decimal
import json
import os
import sys
import threading
import time
from decimal import Decimal

import numpy as np
import pyarrow as pa
from app_checks import check, results
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import partitioning as P
from pyspark.sql.pandas.types import to_arrow_schema

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import schema_from_b64
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.exchange import list_exchanges
from sparkflow_exchange.service.discovery import resolve

N = 3000
JVM_FORMAT = "spark.sparkflow.exchange.jvmFormat"


def same(actual, expected) -> None:
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_column_order=True, ignore_nullable=True)


def python_read(name: str):
    return spark.read.format("pipelined").option("exchange", name).load()


def described(name: str) -> dict:
    return next(e for e in list_exchanges(ExchangeConfig.load()) if e["name"] == name)


resolve(ExchangeConfig.load())  # the embedded service, started by this driver process (no Spark worker)
spark = (SparkSession.builder.master("local[2]").appName("jvm-write")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sql.catalog.committed", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sql.catalog.committed.readWhileWritten", "false")
         .config(JVM_FORMAT, "false")  # format("pipelined") is the Python data source unless a check says otherwise
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.adaptive.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
jvm = spark.sparkContext._jvm

base = spark.range(N).select(
    (F.col("id") % 97).alias("k"), (F.col("id") % 5).alias("j"), F.col("id").alias("v"),
    F.concat(F.lit("s"), F.col("id").cast("string")).alias("s"),
    F.when(F.col("id") % 11 == 0, None).otherwise((F.col("id") / 8).cast("decimal(12,3)")).alias("m"),
    F.expr("timestamp_seconds(id * 3600)").alias("ts"), F.expr("date_add(DATE'2024-01-01', CAST(id AS INT))").alias("day"))


class PythonWorkerWatch(threading.Thread):
    """Samples the JVM's child processes every 20 ms for Spark's Python workers (pyspark.daemon, pyspark.worker,
    the planning workers pyspark.sql.worker.*)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = str(pid)
        self.seen: set[str] = set()
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = f.read().rsplit(")", 1)[1].split()[1]
                    if ppid != self.pid:
                        continue
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "pyspark." in cmd:
                    self.seen.add(cmd.strip())
            self.samples += 1
            self.stop.wait(0.02)


def python_worker_factories() -> int:
    """Spark's Python worker factories (SparkEnv.pythonWorkers, read by reflection: it is private): one appears
    with the first Python worker of any kind (a UDF's, a Python data source's planning or task worker) and stays
    for the application."""
    def field(cls: str, name: str, obj):
        f = jvm.java.lang.Class.forName(cls).getDeclaredField(name)
        f.setAccessible(True)
        return f.get(obj)

    env = field("org.apache.spark.SparkEnv$", "env", field("org.apache.spark.SparkEnv$", "MODULE$", None))
    return field("org.apache.spark.SparkEnv", "pythonWorkers", env).size()


def watched(d: dict, work) -> None:
    """Run ``work`` watched for Python workers; records what was seen in ``d``."""
    watch = PythonWorkerWatch(jvm.java.lang.ProcessHandle.current().pid())
    watch.start()
    d["factories_before"] = python_worker_factories()
    try:
        work()
    finally:
        time.sleep(0.2)
        watch.stop.set()
        watch.join()
    d["factories_after"] = python_worker_factories()
    d["samples"] = watch.samples
    d["workers_seen"] = sorted(watch.seen)


def executed(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


@check
def no_python_worker(d):
    """A JVM write then a JVM read start no Python worker (checked first: nothing Python has run yet)."""
    def work():
        spark.sql("SELECT id AS k, id * 2 AS v FROM range(2000)").writeTo("exchange.jvm_only") \
            .tableProperty("keys", "k").tableProperty("numSubpartitions", "4").create()
        d["rows"] = spark.table("exchange.jvm_only").where("v % 2 = 0").count()

    watched(d, work)
    assert d["rows"] == 2000, d["rows"]
    assert d["samples"] > 5, d["samples"]
    assert d["factories_before"] == d["factories_after"] == 0, d
    assert not d["workers_seen"], d["workers_seen"]


@check
def format_pipelined_is_served_by_the_jvm(d):
    """With the jar loaded, format("pipelined") with numSubpartitions writes and reads through the JVM path: no
    Python worker starts, the read is the exchange's own scan, and groupBy on the key needs no shuffle."""
    out = {}

    def work():
        spark.conf.set(JVM_FORMAT, "true")
        try:
            base.write.format("pipelined").mode("overwrite").option("exchange", "fmt").option("keys", "k") \
                .option("numSubpartitions", "8").save()
            got = spark.read.format("pipelined").option("exchange", "fmt").load()
            grouped = got.groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n"))
            out["plan"] = executed(grouped)
            out["partitions"] = got.rdd.getNumPartitions()
            out["rows"] = sorted(map(tuple, grouped.collect()))
            out["pids"] = got.select(F.spark_partition_id().alias("pid"), "k", "v").collect()
        finally:
            spark.conf.set(JVM_FORMAT, "false")

    watched(d, work)
    d["plan"] = out["plan"]
    assert "sparkflow-exchange fmt" in out["plan"] and "(Python)" not in out["plan"], out["plan"]
    assert "Exchange" not in out["plan"].replace("sparkflow-exchange", ""), out["plan"]
    assert d["samples"] > 5, d["samples"]
    want = base.groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n"))
    assert out["rows"] == sorted(map(tuple, want.collect()))
    assert out["partitions"] == 8, out["partitions"]
    expected = base.repartition(8, "k").select(F.spark_partition_id().alias("pid"), "k", "v")
    same(spark.createDataFrame(out["pids"], expected.schema), expected)
    assert d["factories_before"] == d["factories_after"] == 0, d
    assert not d["workers_seen"], d["workers_seen"]


def placement_equals_repartition(got, source, n: int, *keys: str) -> None:
    """Read partition i holds exactly the rows ``source.repartition(n, *keys)`` puts in partition i."""
    pid = F.spark_partition_id().alias("pid")
    cols = source.columns
    same(got.select(pid, *cols), source.repartition(n, *keys).select(pid, *cols))


@check
def create_hash_one_key(d):
    base.writeTo("exchange.w1").tableProperty("keys", "k").tableProperty("numSubpartitions", "8").create()
    got = python_read("w1")
    same(got, base)
    assert got.rdd.getNumPartitions() == 8
    placement_equals_repartition(got, base, 8, "k")
    desc = described("w1")
    d["partitioner"] = desc["partitioner"]
    assert desc["partitioner"]["name"] == "hash" and desc["partitioner"]["keys"] == ["k"], desc["partitioner"]
    assert desc["num_subpartitions"] == 8 and desc["rows"] == N, desc


@check
def two_keys_append_and_create_or_replace(d):
    first = base.where("v < 2000")
    second = base.where("v >= 2000").withColumn("v", F.col("v") * 10)
    first.writeTo("exchange.w2").option("keys", "k, j").option("numSubpartitions", "8").create()
    second.writeTo("exchange.w2").append()
    both = first.unionByName(second)
    got = python_read("w2")
    same(got, both)
    placement_equals_repartition(got, both, 8, "k", "j")
    d["rows_after_append"] = described("w2")["rows"]
    assert d["rows_after_append"] == N
    third = base.where("v % 3 = 0").withColumn("s", F.upper("s"))
    third.writeTo("exchange.w2").option("keys", "k,j").option("numSubpartitions", "8").createOrReplace()
    got = python_read("w2")
    same(got, third)
    placement_equals_repartition(got, third, 8, "k", "j")


@check
def bucket_transform_is_a_hash(d):
    """partitionedBy(bucket(n, k)) writes the hash on k into n."""
    base.writeTo("exchange.w3").partitionedBy(P.bucket(6, "j")).create()
    got = python_read("w3")
    same(got, base)
    placement_equals_repartition(got, base, 6, "j")


@check
def python_and_jvm_writes_read_through_the_catalog(d):
    base.write.format("pipelined").mode("overwrite").option("exchange", "py1").option("keys", "k") \
        .option("numSubpartitions", "8").save()
    for name in ("py1", "w1"):
        same(spark.table(f"exchange.{name}"), base)
    pid = F.spark_partition_id().alias("pid")
    same(spark.table("exchange.w1").select(pid, *base.columns), spark.table("exchange.py1").select(pid, *base.columns))
    py_schema, jvm_schema = (schema_from_b64(described(n)["schema"]) for n in ("py1", "w1"))
    d["same_schema_bytes"] = described("py1")["schema"] == described("w1")["schema"]
    assert py_schema.equals(jvm_schema, check_metadata=True), (py_schema, jvm_schema)
    # the same rows through the Python writer's own reader: open_reader
    from sparkflow_exchange import open_reader  # noqa: PLC0415

    with open_reader("w1") as reader:
        table = reader.read_all()
    assert sorted(table.column("v").to_pylist()) == list(range(N))
    assert table.schema.equals(to_arrow_schema(base.schema, timezone="UTC")), table.schema


@check
def jvm_append_to_a_python_exchange(d):
    """An append keeps the exchange's schema as declared: a JVM write may extend a Python-written exchange."""
    extra = base.where("v < 100").withColumn("v", F.col("v") + N)
    extra.writeTo("exchange.py1").append()
    same(spark.table("exchange.py1"), base.unionByName(extra))
    placement_equals_repartition(python_read("py1"), base.unionByName(extra), 8, "k")


@check
def other_partitioners(d):
    """broadcast: every reader gets every row; rebalance: an even spread; forward: producer i is reader i."""
    small = base.where("v < 400")
    small.writeTo("exchange.bc").tableProperty("partitioner", "broadcast") \
        .tableProperty("numSubpartitions", "3").create()
    got = python_read("bc")
    assert got.rdd.getNumPartitions() == 3
    same(got, small.union(small).union(small))
    small.writeTo("exchange.rb").tableProperty("partitioner", "rebalance") \
        .tableProperty("numSubpartitions", "5").create()
    counts = python_read("rb").groupBy(F.spark_partition_id()).count().collect()
    d["rebalance_counts"] = sorted(r["count"] for r in counts)
    assert max(d["rebalance_counts"]) - min(d["rebalance_counts"]) <= 2 * small.rdd.getNumPartitions()
    same(python_read("rb"), small)
    small.repartition(3).writeTo("exchange.fw").tableProperty("partitioner", "forward").create()
    same(python_read("fw"), small)


@check
def bad_options_fail_at_planning(d):
    try:
        base.writeTo("exchange.bad").tableProperty("keys", "nope").tableProperty("numSubpartitions", "4").create()
        raise AssertionError("a write hashed on a missing column went through")
    except Exception as exc:  # noqa: BLE001
        d["message"] = str(exc)[:1000]
    assert "hash key 'nope' is not a column" in d["message"], d["message"]
    assert "bad" not in [e["name"] for e in list_exchanges(ExchangeConfig.load())]


@check
def replicas_go_to_the_python_writer_and_need_a_second_host(d):
    """replicas as a session setting: the JVM writer does not push copies, so the write is the Python writer's,
    which refuses it on this one-host application naming why, before any task runs."""
    import sparkflow_exchange  # noqa: PLC0415

    spark.conf.set("spark.sparkflow.exchange.replicas", "1")
    sparkflow_exchange.register(spark)  # planning reads it (not a task's setting)
    try:
        base.write.format("pipelined").option("exchange", "rep").option("numSubpartitions", 4) \
            .option("keys", "k").mode("overwrite").save()
        raise AssertionError("replicas=1 was written on a single host")
    except Exception as exc:  # noqa: BLE001
        d["message"] = str(exc)[:2000]
    finally:
        spark.conf.unset("spark.sparkflow.exchange.replicas")
        sparkflow_exchange.register(spark)
    assert "replicas=1 needs live exchange services on 2 hosts" in d["message"], d["message"]
    assert "rep" not in [e["name"] for e in list_exchanges(ExchangeConfig.load())]


@check
def a_write_in_progress_is_read_as_it_goes(d):
    """A reader of a JVM write still running gets rows before the write ends: a partly filled buffer leaves once
    its rows have waited bufferTimeout. The one task below trickles 100,000 rows, then waits for a marker: its
    batches are larger than the Python worker's 64 KiB output buffer, so each reaches the JVM as it is made, and
    its 16 subpartitions get about 150 KB each, so no buffer (1 MiB) ever fills: only a timed flush sends rows
    before the marker."""
    import tempfile

    from sparkflow_exchange import open_reader  # noqa: PLC0415

    marker = os.path.join(tempfile.mkdtemp(), "go-on")

    def trickle(batches):
        for batch in batches:
            for start in range(0, batch.num_rows, 5000):
                yield batch.slice(start, 5000)
                time.sleep(0.02)
        deadline = time.monotonic() + 300
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)

    source = spark.range(0, 100_000, 1, 1).withColumn("k", F.col("id") % 1009)
    failure: list = []

    def write():
        try:
            source.mapInArrow(trickle, source.schema).writeTo("exchange.live") \
                .tableProperty("keys", "k").tableProperty("numSubpartitions", "16").create()
        except Exception as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    got: list = []
    first = threading.Event()

    def read():
        with open_reader("live", declareTimeout="300") as reader:
            for batch in reader:
                got.append(batch.num_rows)
                first.set()

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    # the task holds its last rows until the marker exists: rows seen before it left while the write ran
    arrived = first.wait(240)
    d["writing_at_first_rows"] = arrived and writer.is_alive()
    open(marker, "w").close()
    writer.join(300)
    reading.join(300)
    assert not failure, failure
    d["rows"] = sum(got)
    assert d["rows"] == 100_000
    assert d["writing_at_first_rows"], "no rows reached the reader while the write ran"


@check
def nested_types_in_many_buffers(d):
    """Structs, maps and lists written by the JVM in many small buffers per subpartition read back exactly by the
    catalog (whose reader loads buffer after buffer into one Arrow root) and by the Python reader."""
    df = spark.range(0, 4000, 1, 2).selectExpr(
        "id", "id % 7 AS k", "named_struct('x', id, 'y', cast(id AS string)) AS st", "map('a', id, 'b', id * 2) AS m",
        "array(named_struct('p', id), null) AS arr", "cast(id / 3 AS decimal(20, 3)) AS dec")
    df.writeTo("exchange.nested").tableProperty("keys", "k").tableProperty("numSubpartitions", "3") \
        .tableProperty("bufferSize", "4k").create()
    want = df.orderBy("id").collect()  # maps cannot be sorted or hashed: rows compared in id order
    for reader, got in (("catalog", spark.table("exchange.nested")), ("python", python_read("nested"))):
        rows = got.orderBy("id").collect()
        d[reader] = len(rows)
        assert rows == want, (reader, rows[:2], want[:2])


@check
def a_catalog_with_commit_timeout_waits_for_the_commit(d):
    """A consumer's catalog with commitTimeout loads an exchange not declared yet once its write commits, and
    reads that commit; a create through the same catalog does not wait."""
    spark.conf.set("spark.sql.catalog.waiting", "org.sparkflow.exchange.catalog.ExchangeCatalog")
    spark.conf.set("spark.sql.catalog.waiting.commitTimeout", "120s")
    spark.conf.set("spark.sql.catalog.waiting.readWhileWritten", "false")
    delay = 3.0
    failure: list = []

    def write_later():
        try:
            time.sleep(delay)
            base.writeTo("exchange.later").tableProperty("keys", "k").tableProperty("numSubpartitions", "4").create()
        except Exception as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    writer = threading.Thread(target=write_later, daemon=True)
    started = time.monotonic()
    writer.start()
    got = spark.table("waiting.later")
    d["waited_s"] = round(time.monotonic() - started, 2)
    writer.join(120)
    assert not failure, failure
    assert d["waited_s"] >= delay, d
    same(got, base)
    started = time.monotonic()
    base.where("v < 10").writeTo("waiting.fresh").tableProperty("keys", "k").create()
    d["create_s"] = round(time.monotonic() - started, 2)
    assert d["create_s"] < 60, d  # far below commitTimeout: the create asked once whether the table exists
    same(python_read("fresh"), base.where("v < 10"))


@check
def decimals_round_trip_exactly_around_a_long(d):
    """Decimals cross the JVM writer and reader as longs where they fit one, as 128-bit values where not: every
    value at and beyond a long's ends, negative ones and nulls read back exactly, by the catalog and by Python."""
    values = ["0", "-1", "1.5", "-0.0001", "922337203685477.5807", "-922337203685477.5808", "922337203685477.5808",
              "-922337203685477.5809", "12345678901234567890123.4567", "-12345678901234567890123.4567",
              "99999999999999999999999999999999.9999", None]
    exact = decimal.Context(prec=60)
    for precision, scale in ((38, 4), (20, 0), (15, 2)):
        rows = []
        for i, v in enumerate(values):  # as unscaled digits: (20, 0) reads them as the integer 10^4 times larger
            value = None if v is None else Decimal(v).scaleb(4 - scale if scale == 0 else 0, exact)
            if value is not None and abs(value) >= Decimal(10) ** (precision - scale):
                value = None  # does not fit the column
            rows.append((i, None if value is None else value.quantize(Decimal(1).scaleb(-scale), context=exact)))
        df = spark.createDataFrame(rows, f"k long, q decimal({precision},{scale})")
        name = f"dec_{precision}_{scale}"
        df.writeTo(f"exchange.{name}").tableProperty("keys", "k").tableProperty("numSubpartitions", "3").create()
        same(spark.table(f"exchange.{name}"), df)
        same(python_read(name), df)
        d[name] = sum(r[1] is not None for r in rows)


LIVE_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
LIVE_ROWS = 40_000


def live_write(name: str):
    """A write of ``name`` from this driver (no Spark task), hash on ``id`` into 4, left open for the check."""
    config = ExchangeConfig.load({"exchange": name, "partitioner": "hash", "keys": "id", "numSubpartitions": "4",
                                  "partitionType": "HYBRID", "bufferSize": "8k"})
    return ex.declare_write(config, LIVE_SCHEMA, overwrite=True)


def live_rows(producer: int, producers: int = 2) -> list:
    """Producer ``producer``'s ids: every ``producers``-th of 0 .. LIVE_ROWS - 1, in two batches."""
    ids = np.arange(producer, LIVE_ROWS, producers, dtype=np.int64)
    half = len(ids) // 2
    return [pa.record_batch([pa.array(part)], schema=LIVE_SCHEMA) for part in (ids[:half], ids[half:])]


def start_live_read(name: str, out: dict, catalog: str = "", placed: bool = False):
    """Plan a format("pipelined") read of ``name`` now (served by the JVM), or ``spark.table`` of ``catalog``,
    and collect it on a thread (``placed``: also each row's read partition, in ``out["placed"]``)."""
    spark.conf.set(JVM_FORMAT, "true")
    try:
        df = spark.table(f"{catalog}.{name}") if catalog else spark.read.format("pipelined").option("exchange", name).load()
    finally:
        spark.conf.set(JVM_FORMAT, "false")
    out["plan"] = executed(df)

    def run():
        try:
            if placed:
                rows = df.select(F.spark_partition_id().alias("pid"), "id").collect()
                out["placed"] = sorted((r.pid, r.id) for r in rows)
                out["ids"] = sorted(r.id for r in rows)
                return
            out["ids"] = sorted(r.id for r in df.collect())
        except Exception as exc:  # noqa: BLE001 - the check asserts on the message
            text = str(exc)
            cause = text.find("ExchangeReadException: ")  # the task's own error, inside Spark's
            out["error"] = text[cause:].splitlines()[0] if cause >= 0 else text

    reading = threading.Thread(target=run, daemon=True)
    reading.start()
    return reading


def commit_under_a_read(d: dict, handle, tasks: list, reading, out: dict) -> None:
    """Finish ``tasks`` and commit them while ``reading`` runs (noted in ``d``); the read then returns every id."""
    parts = [task.finish()["partition"] for task in tasks]
    time.sleep(0.5)
    d["reading_before_commit"] = reading.is_alive()
    wh.commit_write(handle, parts)
    reading.join(120)
    assert "error" not in out, out.get("error")
    assert out["ids"] == list(range(LIVE_ROWS)), len(out["ids"])


def running_tasks() -> int:
    tracker = spark.sparkContext.statusTracker()
    return sum(tracker.getStageInfo(s).numActiveTasks for s in tracker.getActiveStageIds()
               if tracker.getStageInfo(s) is not None)


def until(condition, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@check
def format_reads_a_write_in_progress_in_the_jvm(d):
    """A format("pipelined") read planned while its exchange is written is served by the JVM and reads as the
    producers write: its tasks run (and do not end) before the second producer has even registered and before the
    commit, and it returns exactly the committed rows, each in the partition of its subpartition."""
    handle = live_write("live_fmt")
    first = ex.ProducerTask(handle, 0, "a0")
    first.write(live_rows(0)[:1])
    out: dict = {}
    reading = start_live_read("live_fmt", out)
    d["plan"] = out["plan"]
    assert "sparkflow-exchange live_fmt" in out["plan"] and "read while written" in out["plan"], out["plan"]
    assert until(lambda: running_tasks() > 0), "the read's tasks never started"
    first.write(live_rows(0)[1:])
    time.sleep(1.0)
    d["reading_before_second_producer"] = reading.is_alive() and running_tasks() > 0
    second = ex.ProducerTask(handle, 1, "a1")
    for batch in live_rows(1):
        second.write([batch])
    commit_under_a_read(d, handle, [first, second], reading, out)
    assert d["reading_before_second_producer"] and d["reading_before_commit"], d
    sealed = spark.read.format("pipelined").option("exchange", "live_fmt").load()  # sealed now: same placement
    spark.conf.set(JVM_FORMAT, "true")
    try:
        jvm_sealed = spark.read.format("pipelined").option("exchange", "live_fmt").load()
        expected = jvm_sealed.select(F.spark_partition_id().alias("pid"), "id")
        same(sealed.select(F.spark_partition_id().alias("pid"), "id"), expected)
    finally:
        spark.conf.set(JVM_FORMAT, "false")


@check
def format_read_waits_for_its_exchange_to_be_declared(d):
    """A JVM format read planned before any writer declared its exchange waits up to declareTimeout for it, then
    reads it as it is written; with nothing declared in time it fails naming the exchange and the wait."""
    out: dict = {}

    def plan_and_read():
        spark.conf.set(JVM_FORMAT, "true")  # a session setting: this thread's planning sees it
        try:
            df = spark.read.format("pipelined").option("exchange", "live_late").option("declareTimeout", "120").load()
            out["plan"] = executed(df)
            out["ids"] = sorted(r.id for r in df.collect())
        except Exception as exc:  # noqa: BLE001 - reported below
            out["error"] = str(exc)[:2000]

    reading = threading.Thread(target=plan_and_read, daemon=True)
    reading.start()
    time.sleep(2.0)
    d["planned_before_declared"] = "plan" not in out and reading.is_alive()
    handle = live_write("live_late")
    task = ex.ProducerTask(handle, 0, "a0")
    task.write(live_rows(0, 1))
    wh.commit_write(handle, [task.finish()["partition"]])
    reading.join(120)
    spark.conf.set(JVM_FORMAT, "false")
    assert "error" not in out, out["error"]
    assert "sparkflow-exchange live_late" in out["plan"], out["plan"]
    assert out["ids"] == list(range(LIVE_ROWS)), len(out["ids"])
    assert d["planned_before_declared"], d
    spark.conf.set(JVM_FORMAT, "true")
    try:
        spark.read.format("pipelined").option("exchange", "never_declared").option("declareTimeout", "1").load()
        raise AssertionError("a read of an exchange nobody declared was planned")
    except Exception as exc:  # noqa: BLE001 - Spark's own error type
        d["missing"] = str(exc)[:500]
    finally:
        spark.conf.set(JVM_FORMAT, "false")
    assert "exchange 'never_declared' does not exist (waited 1 s" in d["missing"], d["missing"]


@check
def a_catalog_reads_as_the_producers_write(d):
    """spark.table of a catalog (readWhileWritten on by default) reads an exchange being written as it goes, laid
    out to the application's task slots (2 of local[2]: partition j holds bucket(2, id) = j), and returns exactly the
    committed rows; a catalog set to readWhileWritten=false refuses it at planning."""
    handle = live_write("live_cat")
    first = ex.ProducerTask(handle, 0, "a0")
    first.write(live_rows(0))
    try:
        spark.table("committed.live_cat").collect()
        raise AssertionError("the catalog with readWhileWritten=false read an exchange being written")
    except Exception as exc:  # noqa: BLE001 - Spark's own error type
        d["refused"] = str(exc)[:300]
    assert "still being written" in d["refused"], d["refused"]
    out: dict = {}
    reading = start_live_read("live_cat", out, catalog="exchange", placed=True)
    d["plan"] = out["plan"]
    assert "read while written, laid out to 2 task slots" in out["plan"] and "in 2 read partitions" in out["plan"], \
        out["plan"]
    grouped = executed(spark.table("exchange.live_cat").groupBy("id").count())  # planned while written too
    four = executed(spark.read.option("taskSlots", "4").table("exchange.live_cat"))
    assert "in 4 read partitions, read while written, laid out to 4 task slots" in four, four
    try:
        executed(spark.read.option("taskSlots", "none").table("exchange.live_cat"))
        raise AssertionError("taskSlots=none was taken")
    except Exception as exc:  # noqa: BLE001 - Spark's own error type
        d["bad_slots"] = str(exc)[:300]
    assert "the read option taskSlots must be a number of task slots (1 or more), got 'none'" in d["bad_slots"], d
    d["grouped_plan"] = grouped
    assert "read while written" in grouped and "Exchange" not in grouped.replace("sparkflow-exchange", ""), grouped
    assert until(lambda: running_tasks() > 0), "the read's tasks never started"
    second = ex.ProducerTask(handle, 1, "a1")
    second.write(live_rows(1))
    commit_under_a_read(d, handle, [first, second], reading, out)
    expected = sorted((r.pid, r.id) for r in spark.range(LIVE_ROWS).select(
        F.expr("pmod(hash(id), 2)").alias("pid"), "id").collect())
    assert out["placed"] == expected, "read partition j of 2 is not bucket(2, id) = j"
    assert d["reading_before_commit"], d


@check
def a_read_in_progress_fails_rather_than_return_rows_the_commit_does_not_hold(d):
    """Rows read from an attempt that then loses the commit, or from a write that is aborted, fail the read with
    a message saying so; an attempt that fails before giving rows is passed over, and the read is exact."""
    handle = live_write("live_lost")
    loser = ex.ProducerTask(handle, 0, "loser")
    loser.write(live_rows(0, 1))
    lost_part = loser.finish()["partition"]
    out: dict = {}
    reading = start_live_read("live_lost", out)
    winner = ex.ProducerTask(handle, 0, "winner")
    winner.write(live_rows(0, 1))
    win_part = winner.finish()["partition"]
    assert until(lambda: running_tasks() > 0), "the read's tasks never started"
    time.sleep(1.0)
    wh.commit_write(handle, [win_part])
    reading.join(120)
    d["lost_commit"] = out.get("error", "")[:800]
    assert "which the commit does not hold" in d["lost_commit"] and lost_part in d["lost_commit"], out

    handle = live_write("live_aborted")
    task = ex.ProducerTask(handle, 0, "a0")
    task.write(live_rows(0, 1))
    out = {}
    reading = start_live_read("live_aborted", out)
    assert until(lambda: running_tasks() > 0), "the read's tasks never started"
    wh.abort_write(handle, "the test aborts it")
    reading.join(120)
    d["aborted"] = out.get("error", "")[:800]
    assert "was aborted" in d["aborted"] and "live_aborted" in d["aborted"], out

    handle = live_write("live_retried")
    failing = ex.ProducerTask(handle, 0, "fails")
    out = {}
    reading = start_live_read("live_retried", out)
    assert until(lambda: running_tasks() > 0), "the read's tasks never started"
    time.sleep(0.5)
    failing.fail("the test fails this attempt before it writes")
    retry = ex.ProducerTask(handle, 0, "retry")
    retry.write(live_rows(0, 1))
    wh.commit_write(handle, [retry.finish()["partition"]])
    reading.join(120)
    assert "error" not in out, out.get("error")
    assert out["ids"] == list(range(LIVE_ROWS)), len(out["ids"])


@check
def format_pipelined_hands_the_rest_to_the_python_source(d):
    """format("pipelined") options the JVM path does not serve go to the Python data source, with its answers;
    modes append and error are served by the JVM path; jvmFormat=false sends everything to Python."""
    spark.conf.set(JVM_FORMAT, "true")
    try:
        small = base.where("v < 500")
        small.write.format("pipelined").mode("overwrite").option("exchange", "fmt_coalesced").option("keys", "k").save()
        d["coalesce"] = described("fmt_coalesced")["coalesce"]  # no numSubpartitions: the Python writer's layout
        assert d["coalesce"] is True, d
        waiting = spark.read.format("pipelined").option("exchange", "fmt_coalesced").option("declareTimeout", "5").load()
        assert "(Python)" in executed(waiting), executed(waiting)
        same(waiting, small)
        coalesced = spark.read.format("pipelined").option("exchange", "fmt_coalesced").load()
        assert "(Python)" in executed(coalesced), executed(coalesced)  # the Python reader's coalescing
        same(coalesced, small)

        def fmt(df, mode=None):
            w = df.write.format("pipelined").option("exchange", "fmt_modes").option("keys", "k") \
                .option("numSubpartitions", "4")
            (w.mode(mode) if mode else w).save()

        small.write.format("pipelined").mode("overwrite").option("exchange", "fmt_modes").option("keys", "j") \
            .option("numSubpartitions", "2").option("partitionType", "BLOCKING").save()
        fmt(small, "overwrite")  # declared anew: nothing kept from the exchange it replaces
        d["replaced"] = {k: described("fmt_modes")[k] for k in ("partitioner", "partition_type", "num_subpartitions")}
        assert d["replaced"]["partition_type"] == "HYBRID" and d["replaced"]["partitioner"]["keys"] == ["k"], d
        fmt(small, "append")
        jvm_read = spark.read.format("pipelined").option("exchange", "fmt_modes").load()
        assert "sparkflow-exchange fmt_modes" in executed(jvm_read), executed(jvm_read)
        same(jvm_read, small.unionAll(small))
        assert jvm_read.rdd.getNumPartitions() == 4
        grouped = spark.read.format("pipelined").option("exchange", "fmt_modes").option("readPartitions", "2").load()
        d["grouped_partitions"] = grouped.rdd.getNumPartitions()  # the option reaches the JVM reader
        assert d["grouped_partitions"] == 2 and "sparkflow-exchange fmt_modes" in executed(grouped), executed(grouped)
        same(grouped, small.unionAll(small))
        try:
            fmt(small)  # mode error, the exchange exists
            raise AssertionError("a write in mode error replaced an existing exchange")
        except Exception as exc:  # noqa: BLE001 - Spark's own error type
            d["error_mode"] = str(exc).splitlines()[0][:300]
            assert "already exists" in d["error_mode"], d["error_mode"]
        spark.conf.set(JVM_FORMAT, "false")
        python = spark.read.format("pipelined").option("exchange", "fmt_modes").load()
        assert "(Python)" in executed(python), executed(python)
        same(python, small.unionAll(small))
    finally:
        spark.conf.set(JVM_FORMAT, "false")


def refused(d: dict, key: str, work, *needles: str) -> None:
    """``work`` fails, its first line naming every needle; kept in ``d[key]``."""
    try:
        work()
    except Exception as exc:  # noqa: BLE001 - Spark wraps the cause in its own type
        d[key] = next((line for line in str(exc).splitlines() if needles[0] in line), str(exc).splitlines()[0])[:600]
        for needle in needles:
            assert needle in str(exc), (needle, str(exc)[:3000])
        return
    raise AssertionError(f"{key}: accepted")


@check
def an_append_in_another_layout_is_refused_on_every_writer(d):
    """An exchange created hash(a) into 4 (by either writer) refuses an append on b (by either writer), and one
    created hash(a, b) refuses hash(b, a): Spark, told the exchange is grouped by a, groups and prunes correctly."""
    rows = spark.range(2000).select((F.col("id") % 50).alias("a"), (F.col("id") % 13).alias("b"), F.col("id").alias("v"))

    def python_write(name, keys, mode):
        rows.write.format("pipelined").mode(mode).option("exchange", name).option("keys", keys) \
            .option("numSubpartitions", "4").save()

    rows.writeTo("exchange.lay_jvm").tableProperty("keys", "a").tableProperty("numSubpartitions", "4").create()
    python_write("lay_py", "a", "overwrite")
    for name in ("lay_jvm", "lay_py"):
        refused(d, f"python_append_{name}", lambda name=name: python_write(name, "b", "append"),
                "with another layout", "holds hash(a) into 4 subpartitions", "this write has hash(b) into 4")
    spark.conf.set(JVM_FORMAT, "true")
    try:
        refused(d, "jvm_append_lay_py", lambda: rows.write.format("pipelined").mode("append").option("exchange", "lay_py")
                .option("keys", "b").option("numSubpartitions", "4").save(), "layout")
    finally:
        spark.conf.set(JVM_FORMAT, "false")
    python_write("lay_two", "a,b", "overwrite")
    refused(d, "python_append_two_keys", lambda: python_write("lay_two", "b,a", "append"),
            "holds hash(a, b) into 4", "this write has hash(b, a)")
    for name in ("lay_jvm", "lay_py"):
        assert described(name)["partitioner"]["keys"] == ["a"] and described(name)["rows"] == 2000, described(name)
        table = spark.table(f"exchange.{name}")
        d[f"groups_{name}"] = table.groupBy("a").count().count()
        assert d[f"groups_{name}"] == 50, d
        assert table.where("a = 7").count() == 40
        placement_equals_repartition(python_read(name), rows, 4, "a")


@check
def key_filters_resolve_columns_as_spark_does(d):
    """spark.sql.caseSensitive=true, columns k and K, hashed on K: WHERE k = 5 prunes nothing by k's value (k is
    not a key), WHERE K = 5 prunes to K's subpartition; both readers of the jar return every matching row."""
    spark.conf.set("spark.sql.caseSensitive", "true")
    spark.conf.set(JVM_FORMAT, "true")
    try:
        src = spark.range(160).select((F.col("id") % 8).alias("k"), ((F.col("id") * 7 + 3) % 11).alias("K"),
                                      F.col("id").alias("v"))
        src.writeTo("exchange.cased").tableProperty("keys", "K").tableProperty("numSubpartitions", "8").create()
        readers = {"catalog": lambda: spark.table("exchange.cased"),
                   "format": lambda: spark.read.format("pipelined").option("exchange", "cased").load()}
        for reader, read in readers.items():
            for where in ("k = 5", "k IN (5, 6)", "K = 5", "K IN (5, 6)", "k = 5 AND K = 2"):
                got = sorted(r["v"] for r in read().where(where).collect())
                want = sorted(r["v"] for r in src.where(where).collect())
                assert got == want and want, (reader, where, len(got), len(want))
            d[f"{reader}_plan"] = executed(read().where("K = 5"))
            assert "(1 read)" in d[f"{reader}_plan"], d[f"{reader}_plan"]  # K is the key: pruned to one
            assert "read)" not in executed(read().where("k = 5")), executed(read().where("k = 5"))
    finally:
        spark.conf.set("spark.sql.caseSensitive", "false")
        spark.conf.set(JVM_FORMAT, "false")


@check
def a_failed_write_through_the_jar_changes_nothing(d):
    """bufferSize=1g is refused at planning by the JVM writer, as by the Python writer (nothing declared); an
    overwrite whose tasks fail leaves the committed version readable, with its rows."""
    hundred = spark.range(100).select(F.col("id").alias("k"), F.col("id").alias("v"))
    hundred.writeTo("exchange.kept").tableProperty("keys", "k").tableProperty("numSubpartitions", "4").create()
    epoch = described("kept")["epoch"]
    spark.conf.set(JVM_FORMAT, "true")
    try:
        refused(d, "jvm_buffer_size", lambda: hundred.write.format("pipelined").mode("overwrite")
                .option("exchange", "kept").option("keys", "k").option("numSubpartitions", "4")
                .option("bufferSize", "1g").save(), "bufferSize 1073741824 must be at most half of maxFrameSize")
        failing = hundred.select("k", F.when(F.col("v") == 50, F.raise_error(F.lit("boom"))).otherwise(F.col("v"))
                                 .cast("long").alias("v"))
        refused(d, "tasks_fail", lambda: failing.write.format("pipelined").mode("overwrite").option("exchange", "kept")
                .option("keys", "k").option("numSubpartitions", "4").save(), "boom")
    finally:
        spark.conf.set(JVM_FORMAT, "false")
    refused(d, "python_buffer_size", lambda: hundred.write.format("pipelined").mode("overwrite")
            .option("exchange", "kept").option("keys", "k").option("numSubpartitions", "4")
            .option("bufferSize", "1g").save(), "bufferSize 1073741824 must be at most half of maxFrameSize")
    after = described("kept")
    assert (after["epoch"], after["state"], after["rows"]) == (epoch, "committed", 100), after
    same(spark.table("exchange.kept"), hundred)
    same(python_read("kept"), hundred)


@check
def a_broadcast_read_gives_every_read_partition_one_copy(d):
    """A broadcast exchange of 4 copies read by the catalog with readPartitions=auto under adaptive execution: 4
    read partitions, each every row once, as the Python reader."""
    small = base.where("v < 300").select("k", "v")
    small.writeTo("exchange.bc4").tableProperty("partitioner", "broadcast").tableProperty("numSubpartitions", "4") \
        .create()
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        for reader, got in (("catalog", spark.table("exchange.bc4")), ("python", python_read("bc4"))):
            per = got.groupBy(F.spark_partition_id().alias("pid")).agg(F.count("*").alias("n"),
                                                                         F.countDistinct("v").alias("distinct"))
            d[reader] = sorted((r["pid"], r["n"], r["distinct"]) for r in per.collect())
            assert d[reader] == [(i, 300, 300) for i in range(4)], (reader, d[reader])
        # no width: each producer's one subpartition is every reader's (one read partition per producer)
        small.repartition(3).writeTo("exchange.bc_shared").tableProperty("partitioner", "broadcast").create()
        for reader, got in (("catalog_shared", spark.table("exchange.bc_shared")),
                            ("python_shared", python_read("bc_shared"))):
            per = got.groupBy(F.spark_partition_id().alias("pid")).agg(F.count("*").alias("n"),
                                                                         F.countDistinct("v").alias("distinct"))
            d[reader] = sorted((r["pid"], r["n"], r["distinct"]) for r in per.collect())
            assert [(n, k) for _, n, k in d[reader]] == [(300, 300)] * len(d[reader]) and d[reader], (reader, d)
        assert len(d["catalog_shared"]) == len(d["python_shared"]), d
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", "false")


@check
def a_dataframe_without_columns_keeps_its_rows_or_is_refused(d):
    """spark.range(5).select(): the JVM writer keeps its 5 rows; the Python writer refuses it, naming why."""
    empty = spark.range(5).select()
    empty.writeTo("exchange.nocols").tableProperty("partitioner", "rebalance").tableProperty("numSubpartitions", "2") \
        .create()
    d["jvm_rows"] = spark.table("exchange.nocols").count()
    assert d["jvm_rows"] == 5, d
    try:
        d["python_reader"] = python_read("nocols").count()
    except Exception as exc:  # noqa: BLE001 - recorded: a refusal is an answer too
        d["python_reader"] = str(exc).splitlines()[0][:300]
    assert d["python_reader"] == 5 or "no columns" in str(d["python_reader"]), d
    refused(d, "python", lambda: empty.write.format("pipelined").mode("overwrite").option("exchange", "nocols_py")
            .option("partitioner", "rebalance").option("numSubpartitions", "2").save(), "no columns")


@check
def collated_keys_are_refused_on_both_writers(d):
    """A hash key of STRING COLLATE UTF8_LCASE is refused by both writers, naming the collation (an exchange keeps
    no collation: its rows would be placed, compared and filtered as plain strings)."""
    src = spark.range(90).select(F.expr("CAST(CASE id % 3 WHEN 0 THEN 'abc' WHEN 1 THEN 'ABC' ELSE 'Abc' END "
                                        "AS STRING COLLATE UTF8_LCASE)").alias("k"), F.col("id").alias("v"))
    refused(d, "jvm", lambda: src.writeTo("exchange.collated").tableProperty("keys", "k")
            .tableProperty("numSubpartitions", "8").create(), "collated string", "UTF8_LCASE")
    refused(d, "python", lambda: src.write.format("pipelined").mode("overwrite").option("exchange", "collated_py")
            .option("keys", "k").option("numSubpartitions", "8").save(), "collated string", "UTF8_LCASE")
    names = {e["name"] for e in list_exchanges(ExchangeConfig.load())}
    assert not {"collated", "collated_py"} & names, names


@check
def compressed_exchanges_round_trip_on_every_path(d):
    """compression=zstd|lz4 through the JVM writer (catalog and format("pipelined"); lz4's catalog write on the
    writers' push threads) reads back through the Python reader, open_reader and the JVM reader, holding fewer bytes than the same rows uncompressed; the Python writer's
    compressed exchanges read through the JVM reader; a bad value is refused at planning by both writers, naming the
    choices, with nothing declared."""
    import sparkflow_exchange  # noqa: PLC0415

    def held(name: str) -> int | None:  # the bytes the service holds for the exchange (its summary's)
        return next(s for s in sparkflow_exchange.list_exchanges() if s.name == name).bytes

    rows = base.withColumn("text", F.concat(F.lit("carefully final deposits "), (F.col("v") % 37).cast("string")))
    rows.writeTo("exchange.zc_none").tableProperty("keys", "k").tableProperty("numSubpartitions", "4") \
        .tableProperty("compression", "none").create()
    d["bytes_none"] = held("zc_none")
    # with nothing set both writers compress with the contract's default (zstd)
    rows.writeTo("exchange.zc_default").tableProperty("keys", "k").tableProperty("numSubpartitions", "4").create()
    d["bytes_default"] = held("zc_default")
    assert d["bytes_default"] < 0.8 * d["bytes_none"], d
    # the JVM writer reports its bytes as they would be uncompressed too: those of the uncompressed write
    raw = {n: next(s for s in sparkflow_exchange.list_exchanges() if s.name == n).raw_bytes
           for n in ("zc_none", "zc_default")}
    assert raw["zc_none"] == d["bytes_none"] and raw["zc_default"] is not None, (raw, d)
    assert abs(raw["zc_default"] - d["bytes_none"]) < 0.1 * d["bytes_none"], (raw, d)
    same(spark.table("exchange.zc_default"), rows)
    # read layouts size by what subpartitions decode to: the compressed exchange reads in as many partitions as the
    # same rows uncompressed (by its stored bytes it would be coalesced into fewer, larger ones)
    layout = {"spark.sql.adaptive.enabled": "true",  # readPartitions=auto coalesces as adaptive execution would
              "spark.sql.adaptive.advisoryPartitionSizeInBytes": str(max(1, d["bytes_none"] // 3)),
              "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false"}
    before = {k: spark.conf.get(k, None) for k in layout}
    for k, v in layout.items():
        spark.conf.set(k, v)
    try:
        d["read_partitions"] = {n: spark.table(f"exchange.{n}").rdd.getNumPartitions() for n in ("zc_none", "zc_default")}
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    assert d["bytes_default"] < d["bytes_none"] // 3 and d["read_partitions"] == {"zc_none": 4, "zc_default": 4}, d
    for codec in ("zstd", "lz4"):
        jvm_name, fmt_name, py_name = f"zc_{codec}", f"zc_fmt_{codec}", f"zc_py_{codec}"
        # lz4's buffers are compressed and pushed on each writer's push thread (compressionThread), zstd's on the task's
        rows.writeTo(f"exchange.{jvm_name}").tableProperty("keys", "k").tableProperty("numSubpartitions", "4") \
            .tableProperty("compression", codec) \
            .tableProperty("compressionThread", "true" if codec == "lz4" else "false").create()
        d[f"bytes_{codec}"] = held(jvm_name)
        spark.conf.set(JVM_FORMAT, "true")
        try:
            rows.write.format("pipelined").mode("overwrite").option("exchange", fmt_name).option("keys", "k") \
                .option("numSubpartitions", "4").option("compression", codec.upper()).save()
            jvm_read = spark.read.format("pipelined").option("exchange", fmt_name).load()
            assert "sparkflow-exchange" in executed(jvm_read), executed(jvm_read)
            same(jvm_read, rows)
        finally:
            spark.conf.set(JVM_FORMAT, "false")
        rows.write.format("pipelined").mode("overwrite").option("exchange", py_name).option("keys", "k") \
            .option("numSubpartitions", "4").option("compression", codec).save()
        for name in (jvm_name, fmt_name, py_name):
            same(spark.table(f"exchange.{name}"), rows)  # the JVM reader
            same(python_read(name), rows)  # the Python reader
        placement_equals_repartition(python_read(jvm_name), rows, 4, "k")
        from sparkflow_exchange import open_reader  # noqa: PLC0415

        with open_reader(jvm_name) as reader:
            assert sorted(reader.read_all().column("v").to_pylist()) == list(range(N))
        assert d[f"bytes_{codec}"] < 0.8 * d["bytes_none"], d
    # the session's setting, as the Python writer reads it, is the JVM writer's default too
    spark.conf.set("spark.sparkflow.exchange.compression", "zstd")
    try:
        rows.writeTo("exchange.zc_session").tableProperty("keys", "k").tableProperty("numSubpartitions", "4").create()
        rows.write.format("pipelined").mode("overwrite").option("exchange", "zc_session_py").option("keys", "k") \
            .option("numSubpartitions", "4").save()
    finally:
        spark.conf.unset("spark.sparkflow.exchange.compression")
    d["bytes_session"], d["bytes_session_py"] = held("zc_session"), held("zc_session_py")
    assert d["bytes_session"] < 0.8 * d["bytes_none"], d
    same(spark.table("exchange.zc_session"), rows)
    spark.conf.set(JVM_FORMAT, "true")
    try:
        refused(d, "jvm_bad", lambda: rows.writeTo("exchange.zc_bad").tableProperty("keys", "k")
                .tableProperty("numSubpartitions", "4").tableProperty("compression", "gzip").create(),
                "unknown compression 'gzip'; use one of none, zstd, lz4")
        refused(d, "jvm_fmt_bad", lambda: rows.write.format("pipelined").mode("overwrite").option("exchange", "zc_bad")
                .option("keys", "k").option("numSubpartitions", "4").option("compression", "gzip").save(),
                "unknown compression 'gzip'; use one of none, zstd, lz4")
    finally:
        spark.conf.set(JVM_FORMAT, "false")
    refused(d, "python_bad", lambda: rows.write.format("pipelined").mode("overwrite").option("exchange", "zc_bad_py")
            .option("keys", "k").option("numSubpartitions", "4").option("compression", "gzip").save(),
            "unknown compression 'gzip'; use one of none, zstd, lz4")
    names = {e["name"] for e in list_exchanges(ExchangeConfig.load())}
    assert not {"zc_bad", "zc_bad_py"} & names, names


if __name__ == "__main__":  # run by itself (tests/app_jvm_write_and_catalog.py runs it as a part)
    print(json.dumps(results))
    spark.stop()
