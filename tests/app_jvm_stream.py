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


@check
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


@check
def python_sink_read_by_jvm_in_real_time_mode(d):
    src, rows = source_files("py2rtm")
    python_write(src, "py2rtm")
    reader = spark.readStream.format("pipelined").option("exchange", "py2rtm").load()
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
    assert exc is None, exc
    assert_df_equality(spark.table("py2rtm_out"), rows, ignore_row_order=True, ignore_nullable=True)


checks = os.environ.get("JVM_STREAM_CHECKS")
print(json.dumps({k: v for k, v in results.items() if not checks or k in checks.split(",")}))
spark.stop()
