"""One application of tests/test_jvm_stream_kill.py, run with the plugin jar as argv[1] and a mode as argv[2]:

* ``write``: the writer query, parquet files (a replayable upstream, one file per micro-batch) -> stream ``a`` by the
  JVM sink in micro-batches; with ``--gate`` the batch of file GATE hands on half its rows, then waits for the kill
  (a mapInArrow that yields the file's rows unchanged, in the same order, on a replay).
* ``read``: the reader queries, both through the JVM source: stream ``a`` -> Real-time Mode -> stream ``b`` (the JVM
  sink), and stream ``a`` -> micro-batches -> parquet.
* ``restart``: both again from their checkpoints, until ``b`` committed every row and the parquet holds them; then
  ``b``'s committed epochs are read into parquet (micro-batches, the JVM source), and each sink's rows counted.

The services are the test's (spark-defaults.conf names them); the test kills this process group with SIGKILL.
Prints one JSON line when it ends by itself (a query's failure, or the restart's findings).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

WORK = Path(os.environ["KILL_WORK"])
FILES = int(os.environ["KILL_FILES"])
ROWS = int(os.environ["KILL_ROWS"])  # rows per file
GATE = int(os.environ["KILL_GATE"])  # the file whose batch the first writer is killed in
mode, flags = sys.argv[2], set(sys.argv[3:])

spark = (SparkSession.builder.master("local[4]").appName(f"jvm-stream-kill-{mode}")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")  # 4 Arrow batches per file
         .config("spark.sql.streaming.realTimeMode.allowlistCheck", "false")  # the exchange sink is not on it
         # 1-second Real-time Mode batches (Spark's least is 5 s): the writer waits for the Real-time Mode group, which
         # moves at its batches' ends, once per epoch; the kill and the restart are the same at any batch length
         .config("spark.sql.streaming.realTimeMode.minBatchDuration", "1000")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out: dict = {"mode": mode}


def gate_batches(batches):
    """The rows unchanged; in the first run, the gated file's batch stops once it handed on half the file (whole
    Arrow batches, each larger than the Python worker's output buffer, so they reach the sink) until killed."""
    gated = "--gate" in flags
    for b in batches:
        first = b.column(0)[0].as_py() if b.num_rows else -1
        if gated and first >= GATE * ROWS + ROWS // 2 and first // ROWS == GATE:
            (WORK / "halfway").touch()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # the test kills this application meanwhile
                time.sleep(0.2)
            raise RuntimeError("the writer was not killed")
        yield b


def start_writer():
    """Parquet files -> stream a, the JVM sink in micro-batches (availableNow: it stops when every file is written)."""
    src = WORK / "src"
    schema = spark.read.parquet(str(src / "f0")).schema
    files = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
             .parquet(str(src)))
    return (files.mapInArrow(gate_batches, schema).writeStream.format("pipelined").option("exchange", "a")
            .option("numSubpartitions", 2).option("partitioner", "hash").option("keys", "p")
            .option("stream.consumerGroups", "rt,mb").option("stream.maxRetainedBytes", os.environ["KILL_MAX_RETAINED"])
            .option("compression", "none")  # maxRetainedBytes counts what is held: raw, so the writer must wait
            .option("checkpointLocation", str(WORK / "w-ck")).trigger(availableNow=True).start())


def start_readers():
    """a -> Real-time Mode -> stream b (the JVM sink); a -> micro-batches -> parquet (both through the JVM source)."""
    rt = (spark.readStream.format("pipelined").option("exchange", "a").option("consumerGroup", "rt").load()
          .writeStream.format("pipelined").option("exchange", "b").option("numSubpartitions", 2)
          .option("partitioner", "hash").option("keys", "p").option("stream.consumerGroups", "check")
          .option("_asyncProgressTrackingOverrideSinkSupportCheck", "true").outputMode("update")
          .option("checkpointLocation", str(WORK / "rt-ck")).trigger(realTime="1 second").start())
    mb = (spark.readStream.format("pipelined").option("exchange", "a").option("consumerGroup", "mb").load()
          .writeStream.format("parquet").option("path", str(WORK / "mb-out"))
          .option("checkpointLocation", str(WORK / "mb-ck")).trigger(processingTime="1 second").start())
    return rt, mb


def until_killed(queries) -> None:
    """Run until the test kills this application; a query that fails first ends it, saying why."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and all(q.exception() is None for q in queries):
        time.sleep(0.2)
    print(json.dumps({"errors": [str(q.exception()) for q in queries if q.exception() is not None]}))
    raise SystemExit(3)


if mode == "write":
    until_killed([start_writer()])
if mode == "read":
    until_killed(start_readers())
# restart: the writer and the readers from their checkpoints, until every row is in both sinks; then the checker
from pyspark.sql import functions as F  # noqa: E402

from sparkflow_exchange.calls import call  # noqa: E402
from sparkflow_exchange.config import ExchangeConfig  # noqa: E402

writer = start_writer()
rt, mb = start_readers()
cfg = ExchangeConfig.load({"coordinator": os.environ["KILL_COORDINATOR"], "secret": os.environ["KILL_SECRET"]},
                          spark_conf={})
want = FILES * ROWS
deadline = time.monotonic() + 300
while time.monotonic() < deadline and all(q.exception() is None for q in (writer, rt, mb)):
    # b keeps every committed epoch for group check, which has read none yet
    if not writer.isActive and call(cfg, "stream_describe", name="b")["retained_rows"] >= want and mb.lastProgress \
            and mb.lastProgress["numInputRows"] == 0 and spark.read.parquet(str(WORK / "mb-out")).count() >= want:
        break
    time.sleep(1)
out["errors"] = [str(q.exception()) for q in (writer, rt, mb) if q.exception() is not None]
out["writer"] = writer.lastProgress["sink"]["description"] if writer.lastProgress else None
out["sources"] = sorted({s["description"] for q in (rt, mb) for p in q.recentProgress for s in p["sources"]})
rt.stop()
mb.stop()
check = (spark.readStream.format("pipelined").option("exchange", "b").option("consumerGroup", "check").load()
         .writeStream.format("parquet").option("path", str(WORK / "b-out"))
         .option("checkpointLocation", str(WORK / "b-ck")).trigger(availableNow=True).start())
check.awaitTermination(300)
out["errors"] += [str(check.exception())] if check.exception() is not None else []
# what Spark reads of each sink (a parquet sink's log names its committed files: a killed batch's are not read)
out["sinks"] = {sink: spark.read.parquet(str(WORK / sink)).agg(
    F.count("id").alias("rows"), F.countDistinct("id").alias("distinct"), F.min("id").alias("min"),
    F.max("id").alias("max")).first().asDict() for sink in ("mb-out", "b-out")}
print(json.dumps(out))
spark.stop()
