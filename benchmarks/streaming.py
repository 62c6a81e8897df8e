"""Structured Streaming benchmark: the routes between two queries, measured in ONE SparkSession (the plugin jar on
``spark.jars``), ratios in one run.

Routes:

* ``rtm``: Spark's Real-time Mode (``trigger(realTime=...)``), the JVM stream source and sink (hop case only);
* ``jvm``: micro-batches through the JVM stream source and sink (``format("pipelined")`` with the jar);
* ``python``: micro-batches through the Python data source and sink (``spark.sparkflow.exchange.jvmFormat=false``,
  as without the jar);
* ``files`` (the baseline): parquet files between the two sides (``readStream.parquet`` of a directory);
* ``noop`` (throughput only): the bound no exchange can beat: the writer query into Spark's own ``noop`` sink (the
  same source, planning and triggers, nothing written), then the reader query over the prepared source files
  themselves (the rows already at rest as parquet, read by the same ``foreachBatch``): no route moves the rows in
  less than this;
* ``floor`` (throughput only): a no-op Python stream sink and a Python stream source of the same rows prepared as
  Arrow files (``spark_common.StreamFloor``): what PySpark charges any Python streaming source and sink.

Cases:

1. ``hop``: one hop's latency, a row's push into the route to its arrival in the next query's sink. A producer
   process outside Spark (``stream_ends.py``, the Python client) writes stream A at a fixed rate, a batch every
   2 ms, each row stamped with the wall clock when it is handed over (1 ms buffer timeout); it commits an epoch
   every ``--epoch-ms`` (micro-batch readers read committed epochs; for ``rtm`` one epoch, read as it is
   written); for ``files`` it writes a parquet file every ``--epoch-ms`` instead. One Spark query reads A (the
   route's source) and writes stream B with the route's sink (``files``: the JVM sink), one subpartition; a
   consumer process outside Spark reads B as it is written and stamps each batch's arrival. Latency = arrival -
   stamp; p50/p99/p99.9 over the rows handed over from ``--warmup-seconds`` after the first row arrived (a new
   query's first rows run cold code); every row must arrive once (checked). At each
   rate of ``--rates``, then at the highest sustained rate, searched by doubling (halving) from the highest
   fixed rate: the hop keeps up when the producer holds its rate (95 %), every row arrives within
   ``--grace`` s of the producer's end, and the median latency of the window's last fifth is at most twice its
   first fifth's + 50 ms and twice the route's median at its lowest rate + 50 ms (no backlog that grows, nor one
   that built up and drains). CPU seconds per million rows from ``/proc``: the Spark JVM and its Python workers plus the
   exchange service ("Spark + service"), and the producer and consumer processes ("ends").
2. ``throughput`` (``--repeat`` interleaved rounds, best and median): ``--rows`` rows (long id, long key, 16-char
   string, double) prepared as parquet (2 files) before timing; a writer query reads them with
   ``trigger(availableNow=True)`` into the route, then a reader query with ``availableNow`` aggregates every
   column in ``foreachBatch``. Time from the writer's start to the reader having everything; count and sum(id)
   checked exactly. Per query: the CPU seconds of Spark's processes and of the service (``/proc``), and its Spark
   tasks per stage with their CPU and run seconds (Spark's status store). With ``noop`` in the routes, what the
   JVM route's goals (1.5x ``files``, 3x ``python``) leave over the noop bound.
3. ``latency`` (the older case, micro-batch routes): a rate source (``--rate`` rows/s) written by one query, read
   by another whose ``foreachBatch`` sink stamps when the batch's rows are in the driver; the rate source's
   whole-second offsets put a 0.5 s floor under every route (``from_available`` counts from when it hands a row
   over).

Per-batch durations (``durationMs``, median per phase) are kept in the JSON (``streaming-latest.json`` next to this
file). The embedded exchange service runs from a temp runtime dir; it is stopped by pid and the dir removed. The
load average at the start and end is printed and kept: on a shared machine the tail percentiles are the
scheduler's as much as the route's.

Run: .venv/bin/python benchmarks/streaming.py [--quick] [--only hop,throughput] [--routes rtm,jvm,python,files]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("streaming")  # before Spark starts: its workers and embedded service are this run's

import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from spark_common import (  # noqa: E402
    SCHEMA,
    StreamFloor,
    bench_rows,
    prepare_floor_files,
    service_pids,
    settle,
    stop_embedded_services,
)

SLOTS = 4
N_SUB = 2
FLOOR_PARTS = 2  # the floor route's prepared Arrow files: one read partition each, as the source's 2 parquet files
ROUTES = ("rtm", "jvm", "python", "files")
MICRO_BATCH_ROUTES = ("jvm", "python", "files", "floor", "noop")
EXTRA_ROUTES = {"python-nopoll": ["stream.pollWait=0"],  # the Python route with the reader's long poll off
                "python-8": ["numSubpartitions=8"]}  # the Python route read by 8 tasks
JAR = Path(__file__).resolve().parent.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"
JVM_FORMAT = "spark.sparkflow.exchange.jvmFormat"
ENDS = Path(__file__).resolve().parent / "stream_ends.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true",
                        help="hop: --hop-seconds 8 --search-seconds 6; throughput: --rows 1000000; latency: --seconds 15")
    parser.add_argument("--only", default="hop,throughput", help="comma separated: hop, throughput, latency")
    parser.add_argument("--routes", default=",".join(ROUTES),
                        help="comma separated: rtm (hop only), jvm, python, files, floor, noop (throughput only), "
                             "python-nopoll (stream.pollWait=0), python-8 (8 subpartitions)")
    # hop
    parser.add_argument("--rates", default="1000,10000,100000", help="hop: rows/s, each measured")
    parser.add_argument("--hop-seconds", type=float, default=20.0, help="hop: measured window per rate")
    parser.add_argument("--search-seconds", type=float, default=10.0, help="hop: window of each sustained-rate probe")
    parser.add_argument("--max-rate", type=int, default=1_600_000,
                        help="hop: the search's highest probe (about what the Python producer can hand over)")
    parser.add_argument("--hop-rounds", type=int, default=1, help="hop: rounds per fixed rate (the median kept)")
    parser.add_argument("--epoch-ms", type=float, default=100.0,
                        help="hop: the producer commits an epoch (writes a file) this often (micro-batch routes)")
    parser.add_argument("--rtm-batch", default="5 minutes",
                        help="hop: the Real-time Mode trigger (its checkpoint interval: tasks end and restart then)")
    parser.add_argument("--grace", type=float, default=20.0, help="hop: seconds the last rows may take to arrive")
    # latency (rate source)
    parser.add_argument("--seconds", type=float, default=60.0, help="latency: measured window per route")
    parser.add_argument("--warmup-seconds", type=float, default=5.0,
                        help="hop: rows handed over this long after the first row arrived are counted (the producer "
                             "runs 2x this + the window); latency: left out after the reader starts")
    parser.add_argument("--latency-warmup", type=float, default=4.0,
                        help="latency: an untimed run of this many seconds per route first (0: none)")
    parser.add_argument("--rate", type=int, default=1000, help="latency: rows per second")
    parser.add_argument("--trigger", default="0",
                        help="latency: processingTime of both queries ('0' = as fast as possible; 'default' = "
                             "no trigger() call, which Spark runs as processingTime 0 too)")
    # throughput
    parser.add_argument("--rows", type=int, default=10_000_000, help="throughput: rows")
    parser.add_argument("--repeat", type=int, default=3,
                        help="throughput: rounds, every route once per round (interleaved); best and median kept")
    parser.add_argument("--warmup-rows", type=int, default=100_000,
                        help="throughput: an untimed round of this many rows first (0: none)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option for the pipelined writer and reader (repeatable)")
    parser.add_argument("--writer-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option for the pipelined writer only (repeatable), e.g. compression=lz4")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for the session (repeatable)")
    parser.add_argument("--driver-java-options", default="",
                        help="the driver JVM's options (give them with '='), e.g. --driver-java-options=-Xlog:gc:file=/tmp/gc.log or "
                             "'-XX:StartFlightRecording=filename=/tmp/hop.jfr'")
    parser.add_argument("--arrivals-dir", default="", help="hop: keep each run's (id, latency µs) arrays here")
    parser.add_argument("--jar", default=str(JAR), help="the plugin jar (default: the one setup builds)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "streaming-latest.json"))
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rows, args.hop_seconds, args.search_seconds = 15.0, 1_000_000, 8.0, 6.0
        args.repeat = min(args.repeat, 1)
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    spark = None
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "master": f"local[{SLOTS}]",
                     "argv": sys.argv[1:], "loadavg_start": os.getloadavg()}
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores",
          flush=True)
    try:
        builder = (SparkSession.builder.master(f"local[{SLOTS}]").appName("sparkflow-bench-streaming")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", str(N_SUB)).config("spark.sql.session.timeZone", "UTC")
                   .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
                   .config("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
                   .config("spark.jars", args.jar)
                   .config("spark.driver.memory", "3g"))
        if args.driver_java_options:
            builder = builder.config("spark.driver.extraJavaOptions", args.driver_java_options)
        from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

        for item in [*(f"{k}={v}" for k, v in SPARK_SETTINGS.items()), *args.conf]:  # the recommended settings, then the user's
            key, _, value = item.partition("=")
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        if "hop" in cases:
            results["hop"] = hops(spark, routes, args)
        if "latency" in cases:
            mb = [r for r in routes if r in MICRO_BATCH_ROUTES and r not in ("floor", "noop") or r in EXTRA_ROUTES]
            if args.latency_warmup:  # untimed, every route once: the first query in a session runs cold
                short = argparse.Namespace(**{**vars(args), "seconds": args.latency_warmup, "warmup_seconds": 1.0})
                for r in mb:
                    latency(spark, r, short, quiet=True)
            results["latency"] = {r: latency(spark, r, args) for r in mb}
            report_latency(results["latency"])
        if "throughput" in cases:
            results["throughput"] = throughput(spark, [r for r in routes if r != "rtm"], args)
    finally:
        if spark is not None:
            spark.stop()
        stopped = stop_embedded_services(TMP / "runtime")
        shutil.rmtree(TMP, ignore_errors=True)
        results["loadavg_end"] = os.getloadavg()
    print(f"(stopped exchange service pid(s) {stopped}; removed {TMP}); load average "
          f"{results['loadavg_start'][0]:.1f} at start, {results['loadavg_end'][0]:.1f} at end")
    Path(args.out).write_text(json.dumps(results, indent=2, default=float))


def set_route(spark, route: str) -> None:
    """The session's route for the queries started next: the Python data source for ``python`` (as without the
    jar), the jar's JVM source and sink otherwise."""
    spark.conf.set(JVM_FORMAT, "false" if route.startswith("python") else "true")


# ------------------------------------------------------------------ the two routes
def _opts(stream, options: list[str]):
    for item in options:
        key, _, value = item.partition("=")
        stream = stream.option(key, value)
    return stream


def start_route(spark, route: str, frame, key: str, trigger: dict, args, tag: str):
    """Start the writer query of ``frame`` into the route; returns (writer query, the reader's streaming DataFrame)."""
    ck = str(TMP / f"{tag}-{route}-wck")
    if route == "floor":  # throughput only: the prepared files stand for what the writer query wrote
        query = (frame.writeStream.format("floor_stream").option("checkpointLocation", ck).trigger(**trigger).start())
        source = (spark.readStream.format("floor_stream").option("dir", str(args.floor_dir))
                  .option("parts", FLOOR_PARTS).load())
        return query, source
    if route == "noop":  # throughput only: Spark's no-op sink, then the rows where they already are
        query = frame.writeStream.format("noop").option("checkpointLocation", ck).trigger(**trigger).start()
        return query, spark.readStream.schema(frame.schema).format("parquet").load(str(args.source_dir))
    set_route(spark, route)
    if route in ("jvm", "python") or route in EXTRA_ROUTES:
        opts = [*EXTRA_ROUTES.get(route, []), *args.opt]
        name = f"bench-{tag}-{uuid.uuid4().hex[:8]}"
        writer = _opts(frame.writeStream.format("pipelined").option("exchange", name).option("keys", key)
                       .option("numSubpartitions", N_SUB).option("checkpointLocation", ck),
                       [*opts, *args.writer_opt])
        query = writer.trigger(**trigger).start()
        source = _opts(spark.readStream.format("pipelined").option("exchange", name)
                       .option("declareTimeout", "120s"), opts)
        return query, source.load()
    path = str(TMP / f"{tag}-files")
    query = (frame.writeStream.format("parquet").option("path", path).option("checkpointLocation", ck)
             .trigger(**trigger).start())
    wait_for(lambda: (Path(path) / "_spark_metadata").is_dir() or query.exception() is not None, 120,
             "the file sink's first batch")
    return query, spark.readStream.schema(frame.schema).format("parquet").load(path)


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def task_stats(spark, query) -> dict:
    """The query's Spark jobs from the status store: tasks per stage and the tasks' CPU and run seconds (the
    executor's own counts, apart from the service's and the driver's other threads)."""
    tracker = spark.sparkContext.statusTracker()
    store = spark._jsc.sc().statusStore()
    tasks, cpu, run, seen = [], 0.0, 0.0, set()
    for job in sorted(tracker.getJobIdsForGroup(query.runId)):
        info = tracker.getJobInfo(job)
        for stage in sorted(info.stageIds) if info else []:
            if stage in seen:  # a later job's skipped stage is the one an earlier job ran
                continue
            seen.add(stage)
            try:
                data = store.lastStageAttempt(stage)
            except Exception:  # noqa: BLE001 - a stage the store no longer holds
                continue
            tasks.append(data.numTasks())
            cpu += data.executorCpuTime() / 1e9
            run += data.executorRunTime() / 1e3
    return {"tasks_per_stage": tasks, "task_cpu_s": round(cpu, 2), "task_run_s": round(run, 2)}


def durations(query) -> dict:
    """Median of each durationMs phase over the query's batches (those that read rows), and their count."""
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    phases: dict[str, list[int]] = {}
    for p in progress:
        for k, v in p.get("durationMs", {}).items():
            phases.setdefault(k, []).append(v)
    out = {k: statistics.median(v) for k, v in sorted(phases.items())}
    out["batches"] = len(progress)
    if progress:
        out["rows_per_batch"] = statistics.median(p["numInputRows"] for p in progress)
    return out


# ------------------------------------------------------------------ 1. latency of a trickle
def latency(spark, route: str, args, quiet: bool = False) -> dict:
    trigger = {} if args.trigger == "default" else {"processingTime": f"{args.trigger} seconds"}
    got: list[tuple[np.ndarray, np.ndarray, float]] = []

    def sink(batch, batch_id: int) -> None:
        table = batch.select(F.unix_micros("timestamp").alias("t"), "value").toArrow()
        arrived = time.time()
        if table.num_rows:
            got.append((table.column("t").to_numpy() / 1e6, table.column("value").to_numpy(), arrived))

    settle(spark)
    rate = (spark.readStream.format("rate").option("rowsPerSecond", args.rate).option("numPartitions", 1).load())
    tag = f"latency{uuid.uuid4().hex[:6]}"  # every run its own checkpoints and file-route directory
    writer, source = start_route(spark, route, rate, "value", trigger, args, tag)
    reader = (source.writeStream.foreachBatch(sink).option("checkpointLocation", str(TMP / f"{tag}-{route}-rck"))
              .trigger(**trigger).start())
    try:
        wait_for(lambda: got or reader.exception() or writer.exception(), 120, "the reader's first rows")
        lo = time.time() + args.warmup_seconds
        hi = lo + args.seconds
        wait_for(lambda: (got and got[-1][0].max() >= hi) or reader.exception() or writer.exception(),
                 args.warmup_seconds + args.seconds + 120, "the window's rows")
        for q in (reader, writer):
            if q.exception():
                raise RuntimeError(f"{route}: query failed: {q.exception()}")
    finally:
        writer.stop()
        reader.stop()
    ts = np.concatenate([g[0] for g in got])
    values = np.concatenate([g[1] for g in got])
    lat = np.concatenate([np.full(len(g[0]), g[2]) for g in got]) - ts
    in_window = (ts >= lo) & (ts <= hi)
    window_values = values[in_window]
    distinct = np.unique(values)
    if len(distinct) != len(values):
        raise AssertionError(f"{route}: {len(values) - len(distinct)} rows arrived twice")
    if len(window_values) == 0 or len(window_values) != window_values.max() - window_values.min() + 1:
        raise AssertionError(f"{route}: the window's rows are not all there ({len(window_values)} rows, values "
                             f"{window_values.min() if len(window_values) else None}..{window_values.max() if len(window_values) else None})")
    window = lat[in_window] * 1000.0
    # value v is stamped creation + v/rate s and offered to the writer at the end of its whole second
    created = float(np.median(ts - values / args.rate))
    available = created + (values // args.rate + 1)
    from_available = (lat + ts - available)[in_window] * 1000.0
    result = {"rows": int(in_window.sum()), "p50_ms": float(np.percentile(window, 50)),
              "p99_ms": float(np.percentile(window, 99)), "mean_ms": float(window.mean()),
              "max_ms": float(window.max()), "sink_batches": len(got),
              "from_available_p50_ms": float(np.percentile(from_available, 50)),
              "from_available_p99_ms": float(np.percentile(from_available, 99)),
              "writer_durations_ms": durations(writer), "reader_durations_ms": durations(reader)}
    if quiet:
        return result
    print(f"latency {route:9s}: p50 {result['p50_ms']:7.0f} ms  p99 {result['p99_ms']:7.0f} ms  "
          f"({result['rows']} rows, {len(got)} sink batches); from available: p50 "
          f"{result['from_available_p50_ms']:.0f} ms, p99 {result['from_available_p99_ms']:.0f} ms")
    print(f"    writer per batch {result['writer_durations_ms']}")
    print(f"    reader per batch {result['reader_durations_ms']}")
    return result


def report_latency(lat: dict) -> None:
    for route in [r for r in lat if r != "files"]:
        if "files" in lat:
            for p in ("p50_ms", "p99_ms", "from_available_p50_ms", "from_available_p99_ms"):
                ratio = lat[route][p] / lat["files"][p]
                lat[f"ratio_{route}_{p[:-3]}"] = ratio
                print(f"latency {p[:-3]} {route} / files = {ratio:.2f}")


# ------------------------------------------------------------------ 2. throughput
def throughput(spark, routes: list[str], args) -> dict:
    src = TMP / "throughput-source"
    bench_rows(spark, args.rows, 2).write.parquet(str(src))
    results: dict = {"rows": args.rows}
    args.source_dir = src
    if "floor" in routes:
        spark.dataSource.register(StreamFloor)
    if args.warmup_rows:  # untimed: the JIT, the reader's and writer's Python workers, every route once
        small = TMP / "throughput-warmup"
        spark.read.parquet(str(src)).where(F.col("id") < args.warmup_rows).write.parquet(str(small))
        args.floor_dir = TMP / "floor-warmup"
        args.source_dir = small
        if "floor" in routes:
            prepare_floor_files(args.warmup_rows, args.floor_dir, 1 << 20, FLOOR_PARTS)
        for route in routes:
            through(spark, route, small, args, rows=args.warmup_rows)
    args.floor_dir = TMP / "floor"
    args.source_dir = src
    if "floor" in routes:
        prepare_floor_files(args.rows, args.floor_dir, 1 << 20, FLOOR_PARTS)
    rounds: dict[str, list[dict]] = {route: [] for route in routes}
    for _ in range(args.repeat):  # interleaved: a slow spell of the machine falls on every route
        for route in routes:
            rounds[route].append(through(spark, route, src, args))
    for route, runs in rounds.items():
        best = min(runs, key=lambda r: r["seconds"])
        results[route] = {**best, "rounds": [r["seconds"] for r in runs],
                          "median_seconds": statistics.median(r["seconds"] for r in runs)}
        if args.repeat > 1:
            print(f"throughput {route:9s}: best {best['seconds']:.2f} s (writer {best['writer_seconds']:.2f}, reader "
                  f"{best['reader_seconds']:.2f}), median {results[route]['median_seconds']:.2f} s, rounds "
                  + " ".join(f"{r['seconds']:.2f}" for r in runs))
    base = "jvm" if "jvm" in results else "python"
    for other in [r for r in routes if r != base]:
        if base in results and other in results:
            best = results[other]["seconds"] / results[base]["seconds"]
            median = results[other]["median_seconds"] / results[base]["median_seconds"]
            results[f"speedup_{base}_over_{other}"] = {"best": best, "median": median}
    targets = {"files": 1.5, "python": 3.0}  # the JVM micro-batch route's throughput goals over these routes
    if "noop" in results:
        bound = results["noop"]
        for other, factor in [(r, f) for r, f in targets.items() if r in results]:
            aims = {k: results[other][s] / factor for k, s in (("best", "seconds"), ("median", "median_seconds"))}
            results[f"target_{factor:g}x_{other}"] = {
                **{f"{k}_seconds": v for k, v in aims.items()},
                **{f"{k}_over_noop_seconds": aims[k] - bound[s]
                   for k, s in (("best", "seconds"), ("median", "median_seconds"))}}
    print_throughput(results, routes, base)
    return results


def through(spark, route: str, src: Path, args, rows: int | None = None) -> dict:
    totals: list[tuple[int, int]] = []

    def sink(batch, batch_id: int) -> None:
        row = batch.agg(F.count("*").alias("n"), F.sum("id").alias("ids"), F.sum(F.length("s")).alias("chars"),
                        F.sum("d").alias("d")).first()
        if row.n:
            totals.append((row.n, row.ids))

    settle(spark)
    tag = f"tp{uuid.uuid4().hex[:6]}"
    jvm = [int(spark._jvm.java.lang.ProcessHandle.current().pid())]
    cpu0 = spark_cpu(jvm), spark_cpu(service_pids(TMP / "runtime"))
    start = time.perf_counter()
    frame = spark.readStream.schema(SCHEMA).parquet(str(src))
    writer, source = start_route(spark, route, frame, "key", {"availableNow": True}, args, tag)
    writer.awaitTermination()
    written = time.perf_counter() - start
    cpu_w = spark_cpu(jvm) - cpu0[0], spark_cpu(service_pids(TMP / "runtime")) - cpu0[1]
    reader = (source.writeStream.foreachBatch(sink).option("checkpointLocation", str(TMP / f"{tag}-{route}-rck"))
              .trigger(availableNow=True).start())
    reader.awaitTermination()
    seconds = time.perf_counter() - start
    rows = rows or args.rows
    n, ids = sum(t[0] for t in totals), sum(t[1] for t in totals)
    if (n, ids) != (rows, rows * (rows - 1) // 2):
        raise AssertionError(f"throughput {route}: read {n} rows (sum of ids {ids}), wrote {rows}")
    cpu = spark_cpu(jvm) - cpu0[0], spark_cpu(service_pids(TMP / "runtime")) - cpu0[1]
    result = {"seconds": seconds, "writer_seconds": written, "reader_seconds": seconds - written,
              "cpu_s_per_m_rows": {"spark": round(cpu[0] / rows * 1e6, 2), "service": round(cpu[1] / rows * 1e6, 2)},
              "cpu_s": {"writer_spark": round(cpu_w[0], 2), "writer_service": round(cpu_w[1], 2),
                        "reader_spark": round(cpu[0] - cpu_w[0], 2), "reader_service": round(cpu[1] - cpu_w[1], 2)},
              "writer_durations_ms": durations(writer), "reader_durations_ms": durations(reader),
              "writer_tasks": task_stats(spark, writer), "reader_tasks": task_stats(spark, reader)}
    if rows != args.rows:
        return result
    print(f"throughput {route:9s}: {seconds:6.2f} s (writer query {written:.2f} s, reader query "
          f"{seconds - written:.2f} s); CPU s per M rows {result['cpu_s_per_m_rows']}, CPU s {result['cpu_s']}")
    print(f"    writer {result['writer_durations_ms']} {result['writer_tasks']}")
    print(f"    reader {result['reader_durations_ms']} {result['reader_tasks']}")
    return result


def print_throughput(results: dict, routes: list[str], base: str) -> None:
    """The throughput table, ready for RESULTS.md."""
    print(f"\nthroughput, {results['rows']:,} rows (writer query, then reader query; best of {len(results[routes[0]]['rounds'])}):")
    print("| route | best s (writer / reader query) | median s | rounds | CPU s / M rows (Spark; service) |")
    print("|---|---|---:|---|---:|")
    for route in routes:
        r = results[route]
        cpu = r.get("cpu_s_per_m_rows", {})
        print(f"| {route} | {r['seconds']:.2f} ({r['writer_seconds']:.2f} / {r['reader_seconds']:.2f}) | "
              f"{r['median_seconds']:.2f} | {' '.join(f'{x:.2f}' for x in r['rounds'])} | "
              f"{cpu.get('spark', '-')}; {cpu.get('service', '-')} |")
    for route in routes:
        key = f"speedup_{base}_over_{route}"
        if key in results:
            print(f"| **{base} speedup over {route}** (its seconds / {base}'s) | **{results[key]['best']:.2f}x** | "
                  f"**{results[key]['median']:.2f}x** | | |")
    for key in [k for k in results if k.startswith("target_")]:
        t = results[key]
        factor, _, other = key[len("target_"):].partition("_")
        print(f"{factor} {other}: the route must take at most {t['best_seconds']:.2f} s best / "
              f"{t['median_seconds']:.2f} s median, {t['best_over_noop_seconds']:+.2f} / "
              f"{t['median_over_noop_seconds']:+.2f} s over the noop bound (writer into Spark's noop sink, reader "
              f"over the source files)")


# ------------------------------------------------------------------ 3. one hop, producer and consumer outside Spark
HOP_SCHEMA = "id long, ts_us long"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of it and its reaped children) of every process now."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / CLK_TCK)
    return table


def spark_cpu(roots: list[int]) -> float:
    """CPU seconds so far of ``roots`` and their descendants (the JVM's Python workers, reaped ones included)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        total += table[pid][1]
        todo.extend(children.get(pid, []))
    return total


def _end(role: str, args: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(ENDS), role, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the hop's {role} did not start: {line!r}")
    return proc


def _reap(proc: subprocess.Popen) -> float:
    """Wait for an end's exit; its CPU seconds."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def hop(spark, route: str, rate: int, seconds: float, args) -> dict:
    """One hop at ``rate`` rows/s for ``warmup + seconds``: latency percentiles, whether it kept up, CPU."""
    settle(spark)
    tag = f"h{uuid.uuid4().hex[:8]}"
    a, b = f"{tag}-a", f"{tag}-b"
    total_seconds = 2 * args.warmup_seconds + seconds  # the query's first rows may take a while (cold code)
    files = TMP / f"{tag}-files"
    out = TMP / f"{tag}-arrivals.npy"
    producer = _end("producer", ["--stream", a, "--rate", str(rate), "--seconds", str(total_seconds),
                                 "--epoch-ms", "0" if route == "rtm" else str(args.epoch_ms),
                                 *(["--files", str(files)] if route == "files" else [])])
    consumer = _end("consumer", ["--stream", b, "--out", str(out), "--grace", str(args.grace)])
    set_route(spark, route)
    source = (spark.readStream.schema(HOP_SCHEMA).parquet(str(files)) if route == "files"
              else spark.readStream.format("pipelined").option("exchange", a).option("declareTimeout", "60s").load())
    writer = (source.writeStream.format("pipelined").option("exchange", b).option("numSubpartitions", 1)
              .option("partitioner", "rebalance").option("checkpointLocation", str(TMP / f"{tag}-ck")))
    if route == "rtm":
        writer = (writer.option("_asyncProgressTrackingOverrideSinkSupportCheck", "true").outputMode("update")
                  .trigger(realTime=args.rtm_batch))
    else:
        writer = writer.trigger(processingTime="0 seconds")
    query = writer.start()
    try:
        # running: the Real-time Mode task declared B's first epoch; a micro-batch query waits for data
        wait_for(lambda: query.exception() is not None or (
            _declared(f"{b}#0") if route == "rtm" else not query.status.get("message", "").startswith("Initializing")),
            120, f"the {route} query to start")
        jvm, services = [int(spark._jvm.java.lang.ProcessHandle.current().pid())], service_pids(TMP / "runtime")
        cpu0 = spark_cpu(jvm), spark_cpu(services)
        producer.stdin.write("go\n")
        producer.stdin.flush()
        sent_line = producer.stdout.readline().split()
        producer_cpu = _reap(producer)
        total, took = int(sent_line[1]), float(sent_line[2])
        went = float(sent_line[3]) if len(sent_line) > 3 else 0.0
        consumer.stdin.write(f"total {total}\n")
        consumer.stdin.flush()
        consumer.stdout.readline()
        jvm_cpu, service_cpu = spark_cpu(jvm) - cpu0[0], spark_cpu(services) - cpu0[1]
        cpu = jvm_cpu + service_cpu
        consumer_cpu = _reap(consumer)
        if query.exception() is not None:
            raise RuntimeError(f"{route}: the query failed: {query.exception()}")
    finally:
        query.stop()
        for proc in (producer, consumer):
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    ids, lat = np.load(out)
    if args.arrivals_dir:
        shutil.copy(out, Path(args.arrivals_dir) / f"{route}-{rate}-{tag}.npy")
    unique = len(np.unique(ids))
    if unique != len(ids):
        raise AssertionError(f"{route} at {rate} rows/s: {len(ids) - unique} rows arrived twice")
    # counted: rows handed over from warmup s after the first row arrived (a row's stamp is about id / rate s
    # after the start; its arrival that + its latency)
    first_arrival = float(np.min(ids / rate + lat / 1e6)) if len(ids) else 0.0
    keep = ids >= int(rate * (first_arrival + args.warmup_seconds))
    ms = lat[keep] / 1000.0
    order = np.argsort(ids[keep])
    fifth = max(1, len(order) // 5)
    first, last = (float(np.median(ms[order[:fifth]])), float(np.median(ms[order[-fifth:]]))) if len(ms) else (0, 0)
    arrived = len(ids) == total
    held_rate = total / took >= 0.95 * rate
    kept_up = arrived and held_rate and last <= 2 * first + 50
    result = {"route": route, "rate": rate, "rows": int(keep.sum()), "sent": total, "arrived": int(len(ids)),
              "producer_rate": round(total / took), "kept_up": bool(kept_up),
              "first_arrival_s": round(first_arrival, 2), "producer_start_epoch_s": went,
              "first_fifth_p50_ms": round(first, 2), "last_fifth_p50_ms": round(last, 2),
              "cpu_s_per_m_rows": round(cpu / total * 1e6, 2),
              "ends_cpu_s_per_m_rows": round((producer_cpu + consumer_cpu) / total * 1e6, 2),
              "cpu_s_per_m_rows_by_process": {k: round(v / total * 1e6, 2) for k, v in (
                  ("spark", jvm_cpu), ("service", service_cpu), ("producer", producer_cpu),
                  ("consumer", consumer_cpu))},
              "loadavg": round(os.getloadavg()[0], 1)}
    if len(ms):
        result.update({f"p{q}_ms".replace(".", ""): round(float(np.percentile(ms, q)), 2) for q in (50, 99, 99.9)})
        result["max_ms"] = round(float(ms.max()), 2)
    print(json.dumps(result), flush=True)
    return result


def _declared(exchange: str) -> bool:
    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange.config import ExchangeConfig

    try:
        ex.describe_exchange(ExchangeConfig.load().replace(exchange=exchange, declare_timeout=0.2))
        return True
    except Exception:  # noqa: BLE001 - not declared yet
        return False


def hops(spark, routes: list[str], args) -> dict:
    """Every hop route at each fixed rate (median of ``--hop-rounds`` by p99), then its highest sustained rate."""
    rates = [int(r) for r in args.rates.split(",") if r]
    out: dict = {}
    for route in [r for r in routes if r in ("rtm", "jvm", "python", "files")]:
        hop(spark, route, 1000, 2.0, argparse.Namespace(**{**vars(args), "warmup_seconds": 1.0}))  # untimed: warm
        fixed = {}
        for rate in rates:
            runs = sorted((hop(spark, route, rate, args.hop_seconds, args) for _ in range(args.hop_rounds)),
                          key=lambda r: r.get("p99_ms", float("inf")))
            fixed[rate] = {**runs[len(runs) // 2], "rounds_p99_ms": [r.get("p99_ms") for r in runs]}
        # keeping up also means staying near the route's latency at its lowest rate (a backlog that builds at
        # the start and drains later is not a sustained rate)
        floor = fixed[min(rates)].get("p50_ms", 0.0)

        def sustained(r: dict, floor: float = floor) -> bool:
            r["kept_up"] = r["kept_up"] and r["last_fifth_p50_ms"] <= 2 * floor + 50
            return r["kept_up"]

        kept = [r for r in rates if sustained(fixed[r])]
        best = fixed[max(kept)] if kept else None
        rate = max(kept) * 2 if kept else min(rates) // 2
        while 0 < rate <= args.max_rate and (best is None or rate > best["rate"]):
            probe = hop(spark, route, rate, args.search_seconds, args)
            if sustained(probe):
                best = probe
                if not kept:  # searching downwards: the first rate that keeps up is the answer
                    break
                rate *= 2
            elif kept:
                break
            else:
                rate //= 2
        out[route] = {"fixed": fixed, "sustained": best}
    print_hops(out, rates, args)
    return out


def print_hops(out: dict, rates: list[int], args) -> None:
    """The hop table, ready for RESULTS.md."""
    print(f"\none hop (producer -> route -> next query's sink), window {args.hop_seconds:g} s per rate "
          f"({args.search_seconds:g} s per probe), rtm trigger {args.rtm_batch!r}, epochs every {args.epoch_ms:g} ms, "
          f"load average now {os.getloadavg()[0]:.1f}:")
    print("| route | rows/s | p50 ms | p99 ms | p99.9 ms | max ms | kept up | CPU s / M rows (Spark + service; ends) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for route, r in out.items():
        rows = [r["fixed"][x] for x in rates]
        if r["sustained"] is not None and r["sustained"]["rate"] not in rates:
            rows.append(r["sustained"])
        for x in rows:
            mark = " (highest sustained)" if r["sustained"] is not None and x["rate"] == r["sustained"]["rate"] else ""
            print(f"| {route} | {x['rate']:,}{mark} | {x.get('p50_ms', '-')} | {x.get('p99_ms', '-')} | "
                  f"{x.get('p999_ms', '-')} | {x.get('max_ms', '-')} | {'yes' if x['kept_up'] else 'no'} | "
                  f"{x['cpu_s_per_m_rows']}; {x['ends_cpu_s_per_m_rows']} |")


if __name__ == "__main__":
    main()
