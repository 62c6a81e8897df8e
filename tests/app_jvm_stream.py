"""A Spark application reading and writing streams through the plugin jar's JVM stream source and sink, run by
tests/test_jvm_stream.py with the plugin jar as argv[1]: streams written by the Python sink read exactly by the JVM
source (micro-batches, and Real-time Mode), and the route each query takes.
Prints one JSON line: check name -> {"ok": bool, "error": text, ...details}.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import resolve

WORK = Path(os.environ.get("JVM_STREAM_WORK", "/tmp/jvm-stream"))
N = 3000  # rows per source file; one file per writer micro-batch
FILES = 3
ALLOWLIST = "spark.sql.streaming.realTimeMode.allowlistCheck"
JVM_FORMAT = "spark.sparkflow.exchange.jvmFormat"
results: dict[str, dict] = {}


def check(fn):
    """Run one check now; a failure is recorded with its message, and the other checks still run."""
    details: dict = {}
    started = time.monotonic()
    try:
        fn(details)
        results[fn.__name__] = {"ok": True, **details}
    except Exception as exc:  # noqa: BLE001 - the test asserts on the message
        results[fn.__name__] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:6000],
                                "trace": traceback.format_exc()[-3000:], **details}
    results[fn.__name__]["seconds"] = round(time.monotonic() - started, 2)
    return fn


resolve(ExchangeConfig.load())  # the embedded service, started by this driver process (no Spark worker)
spark = (SparkSession.builder.master("local[4]").appName("jvm-stream")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")


def source_files(name: str) -> tuple[str, object]:
    """FILES parquet files of N rows each (producer p, sequence s within it); the directory and the rows."""
    src = WORK / f"{name}-src"
    for f in range(FILES):
        (spark.range(f * N, (f + 1) * N, numPartitions=1)
         .select(F.col("id"), (F.col("id") % 4).cast("int").alias("p"), (F.col("id") * 7 % 101).alias("v"))
         .write.mode("overwrite").parquet(str(src / f"f{f}")))
    rows = spark.read.parquet(*[str(src / f"f{f}") for f in range(FILES)])
    return str(src), rows


def python_write(src: str, name: str) -> None:
    """The source files as a stream, one epoch per file, written by the Python sink (availableNow: it stops)."""
    schema = spark.read.parquet(src + "/f0").schema
    files = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
             .parquet(src))
    q = (files.writeStream.format("pipelined").option("exchange", name).option("numSubpartitions", 4)
         .option("partitioner", "hash").option("keys", "p")
         .option("checkpointLocation", str(WORK / f"{name}-wck")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def only(fn):
    """A check this run makes (JVM_STREAM_CHECKS: a comma list of names; none: every check)."""
    wanted = os.environ.get("JVM_STREAM_CHECKS")
    return check(fn) if not wanted or fn.__name__ in wanted.split(",") else fn


@only
def python_sink_read_by_jvm_micro_batches(d):
    src, rows = source_files("py2jvm")
    python_write(src, "py2jvm")
    reader = spark.readStream.format("pipelined").option("exchange", "py2jvm").load()
    out = WORK / "py2jvm-out"
    q = (reader.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(WORK / "py2jvm-rck")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    d["sources"] = [s["description"] for s in q.recentProgress[0]["sources"]] if q.recentProgress else []
    d["batches"] = len(q.recentProgress)
    assert_df_equality(spark.read.parquet(str(out)), rows, ignore_row_order=True, ignore_nullable=True)


@only
def python_sink_read_by_jvm_in_real_time_mode(d):
    src, rows = source_files("py2rtm")
    python_write(src, "py2rtm")
    reader = spark.readStream.format("pipelined").option("exchange", "py2rtm").load()
    spark.conf.set(ALLOWLIST, "false")  # the memory sink is not on Real-time Mode's allowlist
    q = (reader.writeStream.format("memory").queryName("py2rtm_out").outputMode("update")
         .option("checkpointLocation", str(WORK / "py2rtm-rck")).trigger(realTime="5 seconds").start())
    deadline = time.monotonic() + 120
    seen = 0
    while time.monotonic() < deadline and q.exception() is None:
        seen = spark.table("py2rtm_out").count()
        if seen >= N * FILES:
            break
        time.sleep(0.5)
    d["seen"] = seen
    exc = q.exception()
    q.stop()
    spark.conf.unset(ALLOWLIST)
    assert exc is None, exc
    assert_df_equality(spark.table("py2rtm_out"), rows, ignore_row_order=True, ignore_nullable=True)


def jvm_write(src: str, name: str, width: int = 4) -> dict:
    """The source files as a stream, one epoch per file, written by the JVM sink (availableNow: it stops)."""
    schema = spark.read.parquet(src + "/f0").schema
    files = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
             .parquet(src))
    q = (files.writeStream.format("pipelined").option("exchange", name).option("numSubpartitions", width)
         .option("partitioner", "hash").option("keys", "p")
         .option("checkpointLocation", str(WORK / f"{name}-wck")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return q.lastProgress["sink"]


@only
def jvm_sink_read_by_python_micro_batches(d):
    src, rows = source_files("jvm2py")
    d["sink"] = jvm_write(src, "jvm2py")["description"]
    spark.conf.set(JVM_FORMAT, "false")  # the Python source reads it
    try:
        reader = spark.readStream.format("pipelined").option("exchange", "jvm2py").load()
        out = WORK / "jvm2py-out"
        q = (reader.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(WORK / "jvm2py-rck")).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        d["sources"] = [s["description"] for s in q.recentProgress[0]["sources"]] if q.recentProgress else []
    finally:
        spark.conf.unset(JVM_FORMAT)
    assert_df_equality(spark.read.parquet(str(out)), rows, ignore_row_order=True, ignore_nullable=True)


@only
def real_time_chain_of_two_queries(d):
    """Stream A (written by the JVM sink) -> RTM query 1 -> stream B -> RTM query 2 -> memory: every row, in order per
    key (each key is one producer's subpartition all the way)."""
    src, rows = source_files("chainA")
    jvm_write(src, "chainA", width=2)
    spark.conf.set(ALLOWLIST, "false")  # neither this sink nor the memory sink is on Real-time Mode's allowlist
    try:
        hop1 = (spark.readStream.format("pipelined").option("exchange", "chainA").load()
                .writeStream.format("pipelined").option("exchange", "chainB").option("numSubpartitions", 2)
                .option("partitioner", "hash").option("keys", "p").outputMode("update")
                .option("_asyncProgressTrackingOverrideSinkSupportCheck", "true")
                .option("checkpointLocation", str(WORK / "chain1-ck")).trigger(realTime="5 seconds").start())
        hop2 = (spark.readStream.format("pipelined").option("exchange", "chainB").option("declareTimeout", "60s")
                .load().writeStream.format("memory").queryName("chain_out").outputMode("update")
                .option("checkpointLocation", str(WORK / "chain2-ck")).trigger(realTime="5 seconds").start())
        deadline = time.monotonic() + 180
        got = []
        while time.monotonic() < deadline and hop1.exception() is None and hop2.exception() is None:
            got = spark.table("chain_out").collect()
            if len(got) >= N * FILES:
                break
            time.sleep(0.5)
        d["seen"] = len(got)
        errors = [str(q.exception()) for q in (hop1, hop2) if q.exception() is not None]
        hop2.stop()
        hop1.stop()
    finally:
        spark.conf.unset(ALLOWLIST)
    assert not errors, errors
    last: dict[int, int] = {}
    for r in got:
        assert r["id"] > last.get(r["p"], -1), f"key {r['p']}: id {r['id']} after {last.get(r['p'])}"
        last[r["p"]] = r["id"]
    assert_df_equality(spark.createDataFrame(got, rows.schema), rows, ignore_row_order=True, ignore_nullable=True)


print(json.dumps(results))
spark.stop()
