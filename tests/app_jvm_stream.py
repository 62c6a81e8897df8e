"""A Spark application reading and writing streams through the plugin jar's JVM stream source and sink, run by
tests/test_jvm_stream.py with the plugin jar as argv[1]: a stream written by the JVM sink read exactly by the Python
source; one written by the Python sink read exactly by the JVM source in micro-batches and by a chain of two
Real-time Mode queries, restarted from its checkpoint; the route each query takes.
Prints one JSON line: check name -> {"ok": bool, "error": text, ...details}.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from app_checks import check, results
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import resolve

WORK = Path(os.environ.get("JVM_STREAM_WORK", "/tmp/jvm-stream"))
N = 3000  # rows per source file; one file per writer micro-batch
START = time.time() - 3600  # the first source file's date
FILES = 3
ALLOWLIST = "spark.sql.streaming.realTimeMode.allowlistCheck"
JVM_FORMAT = "spark.sparkflow.exchange.jvmFormat"


resolve(ExchangeConfig.load())  # the embedded service, started by this driver process (no Spark worker)
spark = (SparkSession.builder.master("local[4]").appName("jvm-stream")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")


def source_file(src: Path, f: int):
    """Parquet file ``f`` of N rows (id increasing from f * N, key p, value v), written without a Spark job, dated f
    seconds after the first: the file source takes them in that order, one per writer micro-batch. Its rows."""
    ids = range(f * N, (f + 1) * N)
    (src / f"f{f}").mkdir(parents=True)
    path = src / f"f{f}" / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array([i % 4 for i in ids], pa.int32()),
                             "v": pa.array([i * 7 % 101 for i in ids], pa.int64())}), path)
    os.utime(path, (START + f, START + f))
    return spark.read.parquet(str(path))


def source_files(name: str) -> tuple[str, object]:
    """FILES parquet files of N rows each (key p, id increasing); the directory and the rows."""
    src = WORK / f"{name}-src"
    for f in range(FILES):
        source_file(src, f)
    rows = spark.read.parquet(*[str(src / f"f{f}") for f in range(FILES)])
    return str(src), rows


def write_stream(src: str, name: str, width: int, groups: str, jvm: bool) -> dict:
    """The source files as a stream, one epoch per file (availableNow: it stops), by the JVM sink or the Python one;
    ``groups``: the consumer groups it keeps every epoch for. The query's last progress."""
    schema = spark.read.parquet(src + "/f0").schema
    files = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
             .parquet(src))
    if not jvm:
        spark.conf.set(JVM_FORMAT, "false")
    try:
        q = (files.writeStream.format("pipelined").option("exchange", name).option("numSubpartitions", width)
             .option("partitioner", "hash").option("keys", "p").option("stream.consumerGroups", groups)
             .option("checkpointLocation", str(WORK / f"{name}-wck")).trigger(availableNow=True).start())
        q.awaitTermination(300)
    finally:
        spark.conf.unset(JVM_FORMAT)
    assert q.exception() is None, q.exception()
    return q.lastProgress


def read_micro_batches(name: str, group: str, out: Path, **options) -> tuple[list[str], list[int]]:
    """Every epoch of the stream into parquet at ``out`` (availableNow); the sources' descriptions, and the rows of
    each micro-batch that read any."""
    reader = spark.readStream.format("pipelined").option("exchange", name).option("consumerGroup", group)
    for key, value in options.items():
        reader = reader.option(key, value)
    q = (reader.load().writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(out) + "-ck").trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return ([s["description"] for p in q.recentProgress for s in p["sources"]],
            [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]])


def until(q_list, table: str, rows: int, seconds: float = 180) -> list:
    """The memory table's rows once it holds ``rows`` (or the deadline passed, or a query failed)."""
    deadline = time.monotonic() + seconds
    got = []
    while time.monotonic() < deadline and all(q.exception() is None for q in q_list):
        got = spark.table(table).collect()
        if len(got) >= rows:
            break
        time.sleep(0.5)
    return got


def in_key_order(got) -> None:
    """Each key's ids arrive increasing: a key is one producer's subpartition all the way."""
    last: dict[int, int] = {}
    for r in got:
        assert r["id"] > last.get(r["p"], -1), f"key {r['p']}: id {r['id']} after {last.get(r['p'])}"
        last[r["p"]] = r["id"]


def only(fn):
    """A check this run makes (JVM_STREAM_CHECKS: a comma list of names; none: every check)."""
    wanted = os.environ.get("JVM_STREAM_CHECKS")
    return check(fn) if not wanted or fn.__name__ in wanted.split(",") else fn


def chain(table: str):
    """RTM query 1: stream py (group chain) -> stream jv2; RTM query 2: jv2 -> memory table ``table`` (a memory sink
    cannot restart from a checkpoint: each table is a new query, in the consumer group ``table``). jv2's writer
    names both tables' groups, so the service keeps every epoch until each has read it: the second table reads
    jv2 from its start however far the first one got.
    Each stream is 2 subpartitions wide: Real-time Mode holds a slot per task, 4 in all of local[4]."""
    hop1 = (spark.readStream.format("pipelined").option("exchange", "py").option("consumerGroup", "chain").load()
            .writeStream.format("pipelined").option("exchange", "jv2").option("numSubpartitions", 2)
            .option("stream.consumerGroups", "chain_out,chain_again")
            .option("partitioner", "hash").option("keys", "p").outputMode("update")
            .option("_asyncProgressTrackingOverrideSinkSupportCheck", "true")
            .option("checkpointLocation", str(WORK / "hop1-ck")).trigger(realTime="5 seconds").start())
    hop2 = (spark.readStream.format("pipelined").option("exchange", "jv2").option("consumerGroup", table).load()
            .writeStream.format("memory").queryName(table).outputMode("update")
            .option("checkpointLocation", str(WORK / f"{table}-ck")).trigger(realTime="5 seconds").start())
    return hop1, hop2


def wait_progress(queries, seconds: float = 60) -> None:
    """Until every query has committed a batch (Real-time Mode writes its offsets after the batch)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(q.lastProgress for q in queries):
        time.sleep(0.5)
    time.sleep(1)


SRC, ROWS = source_files("rows")


@only
def to_table(d):
    """writeStream.toTable("exchange.<stream>") is written by the JVM stream sink with the query's options: a new
    stream (Spark creates the table first), then the existing one from its checkpoint; read back exactly with
    readStream.table. Without numSubpartitions it is refused, naming what to give."""
    def write(name: str, **options):
        files = (spark.readStream.schema(ROWS.schema).option("maxFilesPerTrigger", 1)
                 .option("recursiveFileLookup", "true").parquet(SRC).writeStream)
        for key, value in options.items():
            files = files.option(key, value)
        q = files.option("checkpointLocation", str(WORK / f"{name}-wck")).trigger(availableNow=True) \
            .toTable(f"exchange.{name}")
        q.awaitTermination(300)
        return q
    q = write("tt", numSubpartitions=2, partitioner="hash", keys="p")
    assert q.exception() is None, q.exception()
    d["sink"] = q.lastProgress["sink"]["description"]
    again = write("tt", numSubpartitions=2, partitioner="hash", keys="p")  # the stream exists: nothing new to write
    assert again.exception() is None, again.exception()
    out = WORK / "tt-read"
    r = (spark.readStream.table("exchange.tt").writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(out) + "-ck").trigger(availableNow=True).start())
    r.awaitTermination(300)
    assert r.exception() is None, r.exception()
    assert_df_equality(spark.read.parquet(str(out)), ROWS, ignore_row_order=True, ignore_nullable=True)
    try:
        refused = str(write("tt_unkeyed").exception())
    except Exception as exc:  # noqa: BLE001 - refused at start or in the query: the message is what counts
        refused = str(exc)
    d["refused"] = refused[:2000]


@only
def jvm_sink_read_by_python(d):
    """Stream jv, written by the JVM sink, read exactly by the Python source; the catalog plans it in the JVM."""
    d["sink"] = write_stream(SRC, "jv", 2, "py", jvm=True)["sink"]["description"]
    spark.conf.set(JVM_FORMAT, "false")  # the Python source reads it
    try:
        d["python_sources"] = sorted(set(read_micro_batches("jv", "py", WORK / "jv-py")[0]))
    finally:
        spark.conf.unset(JVM_FORMAT)
    assert_df_equality(spark.read.parquet(str(WORK / "jv-py")), ROWS, ignore_row_order=True, ignore_nullable=True)
    catalog = spark.readStream.table("exchange.jv")  # the catalog's route: planned by the JVM source
    d["catalog_streaming"] = catalog.isStreaming
    assert catalog.isStreaming and [(f.name, f.dataType) for f in catalog.schema] == \
        [(f.name, f.dataType) for f in ROWS.schema], catalog.schema


@only
def python_sink_read_by_jvm_micro_batches_and_a_real_time_chain(d):
    """Stream py, written by the Python sink, read exactly by the JVM source in micro-batches; and py -> RTM query 1
    -> stream jv2 (JVM sink) -> RTM query 2 -> memory: every row, in order per key; query 1 restarted from its
    checkpoint after one more epoch writes only that epoch's rows."""
    d["sink"] = write_stream(SRC, "py", 2, "mb,chain", jvm=False)["sink"]["description"]
    sources, d["batch_rows"] = read_micro_batches("py", "mb", WORK / "py-mb", maxEpochsPerTrigger=1)
    d["sources"] = sorted(set(sources))
    assert_df_equality(spark.read.parquet(str(WORK / "py-mb")), ROWS, ignore_row_order=True, ignore_nullable=True)
    spark.conf.set(ALLOWLIST, "false")  # neither this sink nor the memory sink is on Real-time Mode's allowlist
    try:
        hop1, hop2 = chain("chain_out")
        got = until([hop1, hop2], "chain_out", N * FILES)
        errors = [str(q.exception()) for q in (hop1, hop2) if q.exception() is not None]
        # both queries restart from their checkpoints once each has committed a batch (its offsets per subpartition)
        wait_progress([hop1, hop2])
        d["hop_sources"] = [str(q.lastProgress["sources"][0]["description"]) if q.lastProgress else None
                            for q in (hop1, hop2)]
        hop2.stop()
        hop1.stop()
    finally:
        spark.conf.unset(ALLOWLIST)
    assert not errors, errors
    d["chain_rows"] = len(got)
    in_key_order(got)
    assert_df_equality(spark.createDataFrame(got, ROWS.schema), ROWS, ignore_row_order=True, ignore_nullable=True)
    more = source_file(Path(SRC), FILES)
    write_stream(SRC, "py", 2, "mb,chain", jvm=False)  # the writer query goes on: one more epoch, its file's rows
    # query 1 restarts from its checkpoint (offsets per subpartition): it reads that epoch alone into jv2
    spark.conf.set(ALLOWLIST, "false")
    try:
        hop1, hop2 = chain("chain_again")  # a new query 2 in its own group: from jv2's first epoch, the old rows too
        until([hop1, hop2], "chain_again", N * (FILES + 1))
        time.sleep(6)  # a whole Real-time Mode batch more: nothing read before the restart comes again
        again = spark.table("chain_again").collect()
        errors = [str(q.exception()) for q in (hop1, hop2) if q.exception() is not None]
        hop2.stop()
        hop1.stop()
    finally:
        spark.conf.unset(ALLOWLIST)
    assert not errors, errors
    d["rows_after_restart"] = len(again)
    in_key_order(again)
    # every row once: query 1's restart wrote the new epoch's rows after the old ones, none of the old ones again
    assert_df_equality(spark.createDataFrame(again, ROWS.schema), ROWS.unionByName(more), ignore_row_order=True,
                       ignore_nullable=True)


print(json.dumps(results))
spark.stop()
