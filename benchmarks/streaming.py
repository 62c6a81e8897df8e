"""Structured Streaming benchmark: the exchange between two streaming queries vs the file-stream route.

Two routes, measured in ONE SparkSession, one after the other:

* pipelined: ``writeStream.format("pipelined")`` (hash on the first column, 2 subpartitions) ->
  ``readStream.format("pipelined")``;
* files (the baseline): ``writeStream.format("parquet")`` -> ``readStream.format("parquet")`` with the
  schema given (it reads the sink's ``_spark_metadata`` log, so it sees committed files only).

Cases:

1. latency of a trickle: a rate source (``--rate`` rows/s, one partition) written by one query, read by
   another whose ``foreachBatch`` sink stamps ``time.time()`` when the batch's rows are in the driver
   (``toArrow``; per batch, no per-row Python). A row's latency = that stamp - its ``timestamp`` column
   (when the rate source made it). The rate source's offsets are whole seconds, so a row is handed to
   the writer query only at the end of its second: a floor of 0.5 s median (1 s at worst) in every
   route; ``from_available`` is the same latency counted from that moment (the route's own). Rows are counted from ``--warmup-seconds`` after the reader's first
   batch, for ``--seconds``; both queries run with the same trigger (``--trigger``, default
   ``processingTime=0``: a batch starts as soon as the previous one ended and there is data).
   Every row of the window must arrive exactly once (checked).
2. throughput (``--repeat`` interleaved rounds, best and median): ``--rows`` rows (long id, long key, 16-char string, double) prepared as parquet (2
   files) before timing; a writer query reads them with ``trigger(availableNow=True)`` into the route,
   then a reader query with ``availableNow`` aggregates every column in ``foreachBatch``. Time from the
   writer's start to the reader having everything; count and sum(id) checked exactly. Route ``floor``
   (throughput only): the same two queries through a no-op Python stream sink and a Python stream
   source of the same rows prepared as Arrow files (``spark_common.StreamFloor``): what PySpark
   charges any Python streaming source and sink, nothing of the exchange.

Per-batch durations (``durationMs`` of every progress of both queries, median per phase) are kept in
the JSON (``streaming-latest.json`` next to this file) to show where time goes.
The embedded exchange service runs from a temp runtime dir; it is stopped by pid and the dir removed.

Run: .venv/bin/python benchmarks/streaming.py [--quick] [--seconds 60] [--rows 10000000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
import uuid
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("streaming")  # before Spark starts: its workers and embedded service are this run's

import numpy as np  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from spark_common import SCHEMA, StreamFloor, bench_rows, prepare_floor_files, settle, stop_embedded_services  # noqa: E402

SLOTS = 4
N_SUB = 2
FLOOR_PARTS = 2  # the floor route's prepared Arrow files: one read partition each, as the source's 2 parquet files
ROUTES = ("pipelined", "files")
EXTRA_ROUTES = {"pipelined-nopoll": ["stream.pollWait=0"],  # pipelined with the reader's long poll off
                "pipelined-8": ["numSubpartitions=8"]}  # pipelined read by 8 tasks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="--seconds 15 --rows 1000000")
    parser.add_argument("--seconds", type=float, default=60.0, help="latency: measured window per route")
    parser.add_argument("--warmup-seconds", type=float, default=5.0, help="latency: left out after the reader starts")
    parser.add_argument("--latency-warmup", type=float, default=4.0,
                        help="latency: an untimed run of this many seconds per route first (0: none)")
    parser.add_argument("--rate", type=int, default=1000, help="latency: rows per second")
    parser.add_argument("--rows", type=int, default=10_000_000, help="throughput: rows")
    parser.add_argument("--repeat", type=int, default=1,
                        help="throughput: rounds, every route once per round (interleaved); best and median kept")
    parser.add_argument("--warmup-rows", type=int, default=100_000,
                        help="throughput: an untimed round of this many rows first (0: none)")
    parser.add_argument("--trigger", default="0",
                        help="latency: processingTime of both queries ('0' = as fast as possible; 'default' = "
                             "no trigger() call, which Spark runs as processingTime 0 too)")
    parser.add_argument("--only", default="", help="latency | throughput (default: both)")
    parser.add_argument("--routes", default=",".join(ROUTES),
                        help="comma separated: pipelined, files, pipelined-nopoll (stream.pollWait=0), pipelined-8 (8 subpartitions), "
                             "floor (throughput only: a no-op Python stream sink, then a Python stream source of prepared Arrow files)")
    parser.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                        help="extra option for the pipelined writer and reader (repeatable)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for the session (repeatable)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "streaming-latest.json"))
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rows = 15.0, 1_000_000
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    spark = None
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "master": f"local[{SLOTS}]",
                     "trigger": args.trigger, "opts": args.opt, "conf": args.conf,
                     "loadavg_start": os.getloadavg()}
    try:
        builder = (SparkSession.builder.master(f"local[{SLOTS}]").appName("sparkflow-bench-streaming")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", str(N_SUB)).config("spark.sql.session.timeZone", "UTC")
                   .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
                   .config("spark.driver.memory", "3g"))
        from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

        for item in [*(f"{k}={v}" for k, v in SPARK_SETTINGS.items()), *args.conf]:  # the recommended settings, then the user's
            key, _, value = item.partition("=")
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        if args.only in ("", "latency"):
            if args.latency_warmup:  # untimed, every route once: the first query in a session runs cold
                short = argparse.Namespace(**{**vars(args), "seconds": args.latency_warmup, "warmup_seconds": 1.0})
                for r in routes:
                    latency(spark, r, short, quiet=True)
            results["latency"] = {r: latency(spark, r, args) for r in routes}
            report_latency(results["latency"])
        if args.only in ("", "throughput"):
            results["throughput"] = throughput(spark, routes, args)
    finally:
        if spark is not None:
            spark.stop()
        stopped = stop_embedded_services(TMP / "runtime")
        shutil.rmtree(TMP, ignore_errors=True)
        results["loadavg_end"] = os.getloadavg()
    print(f"(stopped exchange service pid(s) {stopped}; removed {TMP}); load average "
          f"{results['loadavg_start'][0]:.1f} at start, {results['loadavg_end'][0]:.1f} at end")
    Path(args.out).write_text(json.dumps(results, indent=2, default=float))


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
    if route.startswith("pipelined"):
        opts = [*EXTRA_ROUTES.get(route, []), *args.opt]
        name = f"bench-{tag}-{uuid.uuid4().hex[:8]}"
        writer = _opts(frame.writeStream.format("pipelined").option("exchange", name).option("keys", key)
                       .option("numSubpartitions", N_SUB).option("checkpointLocation", ck), opts)
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
    if "pipelined" in lat and "files" in lat:
        for p in ("p50_ms", "p99_ms", "from_available_p50_ms", "from_available_p99_ms"):
            ratio = lat["pipelined"][p] / lat["files"][p]
            lat[f"ratio_{p[:-3]}"] = ratio
            print(f"latency {p[:-3]} pipelined / files = {ratio:.2f}")


# ------------------------------------------------------------------ 2. throughput
def throughput(spark, routes: list[str], args) -> dict:
    src = TMP / "throughput-source"
    bench_rows(spark, args.rows, 2).write.parquet(str(src))
    results: dict = {"rows": args.rows}
    if "floor" in routes:
        spark.dataSource.register(StreamFloor)
    if args.warmup_rows:  # untimed: the JIT, the reader's and writer's Python workers, every route once
        small = TMP / "throughput-warmup"
        spark.read.parquet(str(src)).where(F.col("id") < args.warmup_rows).write.parquet(str(small))
        args.floor_dir = TMP / "floor-warmup"
        if "floor" in routes:
            prepare_floor_files(args.warmup_rows, args.floor_dir, 1 << 20, FLOOR_PARTS)
        for route in routes:
            through(spark, route, small, args, rows=args.warmup_rows)
    args.floor_dir = TMP / "floor"
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
    if "pipelined" in results and "files" in results:
        results["ratio"] = results["pipelined"]["seconds"] / results["files"]["seconds"]
        results["ratio_median"] = results["pipelined"]["median_seconds"] / results["files"]["median_seconds"]
        print(f"throughput pipelined / files = {results['ratio']:.2f} best, {results['ratio_median']:.2f} median of "
              "rounds")
        for route in routes:
            if route.startswith("pipelined-") or route == "floor":
                print(f"throughput {route} / files = {results[route]['seconds'] / results['files']['seconds']:.2f} best, "
                      f"{results[route]['median_seconds'] / results['files']['median_seconds']:.2f} median")
    if "pipelined" in results and "floor" in results:
        results["ratio_to_floor"] = results["pipelined"]["seconds"] / results["floor"]["seconds"]
        print(f"throughput pipelined / floor = {results['ratio_to_floor']:.2f} best, "
              f"{results['pipelined']['median_seconds'] / results['floor']['median_seconds']:.2f} median")
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
    start = time.perf_counter()
    frame = spark.readStream.schema(SCHEMA).parquet(str(src))
    writer, source = start_route(spark, route, frame, "key", {"availableNow": True}, args, tag)
    writer.awaitTermination()
    written = time.perf_counter() - start
    reader = (source.writeStream.foreachBatch(sink).option("checkpointLocation", str(TMP / f"{tag}-{route}-rck"))
              .trigger(availableNow=True).start())
    reader.awaitTermination()
    seconds = time.perf_counter() - start
    rows = rows or args.rows
    n, ids = sum(t[0] for t in totals), sum(t[1] for t in totals)
    if (n, ids) != (rows, rows * (rows - 1) // 2):
        raise AssertionError(f"throughput {route}: read {n} rows (sum of ids {ids}), wrote {rows}")
    result = {"seconds": seconds, "writer_seconds": written, "reader_seconds": seconds - written,
              "writer_durations_ms": durations(writer), "reader_durations_ms": durations(reader)}
    if rows != args.rows:
        return result
    print(f"throughput {route:9s}: {seconds:6.2f} s (writer query {written:.2f} s, reader query "
          f"{seconds - written:.2f} s)")
    print(f"    writer {result['writer_durations_ms']}")
    print(f"    reader {result['reader_durations_ms']}")
    return result


if __name__ == "__main__":
    main()
