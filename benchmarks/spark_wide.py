"""Spark benchmark at Spark's ordinary width: 200 producers x 200 subpartitions, and 2 x 4,000.

One session (``local[2]``, AQE off, the recommended Arrow setting), 4 M rows (long id, long key =
id % 100003, a 16-character string, a double) in 200 partitions, every read ending in
``write.format("noop")``. Cases, interleaved per round after ``--warmup`` rounds, best of ``--repeat``:

* floor: the rows into a no-op Python Arrow sink (200 write tasks), then a trivial Python source
  yielding the same rows from prepared Arrow files (200 read tasks): what Spark charges any Python
  data source at these task counts;
* parquet route: write parquet, read, ``repartition(200, key)``;
* frozen floor (a reference): the floor in workers that freeze their heap after their first
  task as ours do (``freezeWorkerHeap``): Spark's full collection after every task, which the floor
  pays in full, is most of its cost; ``exact / frozen floor`` is the exchange's own cost with that
  saving taken out;
* spark repartition(200, key): Spark's own shuffle;
* exact: ``format("pipelined")`` HYBRID hash on key with ``numSubpartitions=200``, then read
  (200 read tasks, ``spark_partition_id() == subpartition``);
* coalesced: the same without ``numSubpartitions`` under ``spark.sql.shuffle.partitions=200``: the
  read coalesces adjacent subpartitions into read partitions of about ``advisoryPartitionSize``.

Then, write only, 2 producers x 4,000 subpartitions vs 2 x 8 (same rows). Peak RSS (VmHWM) of the
service and of the Python workers (write tasks) is read from /proc after each part.

Run: .venv/bin/python benchmarks/spark_wide.py [--rows 4000000] [--repeat 3] [--warmup 1] [--tcp-workers]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("wide")  # before Spark starts: its workers and embedded service are this run's

from pyspark.sql import SparkSession  # noqa: E402
from spark_common import (  # noqa: E402
    FrozenNoopArrowSink,
    FrozenPreparedBatches,
    NoopArrowSink,
    PreparedBatches,
    bench_rows,
    end_run,
    interleaved_rounds,
    prepare_floor_files,
    service_pids,
    settle,
    status_kib,
    wide_session,
)

from sparkflow_exchange import drop_exchange  # noqa: E402

WIDTH = 200


def python_workers() -> list[int]:
    """Pids of this user's PySpark Python workers (the daemon's forked children run the tasks)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
            pids.append(int(entry.name))
    return pids


def peak_mib(pids: list[int]) -> float:
    return max((status_kib(p, "VmHWM") for p in pids), default=0) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--wide", type=int, default=4000, help="subpartitions of the 2-producer write-only case")
    parser.add_argument("--out", default=None, help="default: spark_wide-latest.json (spark_wide-tcp-latest.json with --tcp-workers)")
    parser.add_argument("--tcp-workers", action="store_true",
                        help="Spark's default TCP sockets to its Python workers (recommended: Unix sockets)")
    args = parser.parse_args()
    spark = None
    try:
        from sparkflow_exchange.config import ExchangeConfig

        config = ExchangeConfig()
        prepare_floor_files(args.rows, TMP / "floor", config.buffer_size, WIDTH)
        spark = wide_session("sparkflow-bench-wide", WIDTH, args.tcp_workers)
        results = run(spark, args)
    finally:
        end_run(spark, TMP)
    out = args.out or str(Path(__file__).parent / f"spark_wide{'-tcp' if args.tcp_workers else ''}-latest.json")
    Path(out).write_text(json.dumps(results, indent=2))


def run(spark: SparkSession, args: argparse.Namespace) -> dict:
    for source in (NoopArrowSink, PreparedBatches, FrozenNoopArrowSink, FrozenPreparedBatches):
        spark.dataSource.register(source)

    def rows(partitions: int):
        return bench_rows(spark, args.rows, partitions)

    df = rows(WIDTH)
    parquet_dir = TMP / "parquet"

    def noop(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def floor() -> None:
        df.write.format("floor_sink").mode("append").save()
        noop(spark.read.format("floor_source").option("dir", str(TMP / "floor")).option("parts", str(WIDTH)).load())

    def frozen_floor() -> None:
        df.write.format("floor_sink_frozen").mode("append").save()
        noop(spark.read.format("floor_source_frozen").option("dir", str(TMP / "floor")).option("parts", str(WIDTH))
             .load())

    def parquet() -> None:
        df.write.mode("overwrite").parquet(str(parquet_dir))
        noop(spark.read.parquet(str(parquet_dir)).repartition(WIDTH, "key"))

    def spark_shuffle() -> None:
        noop(df.repartition(WIDTH, "key"))

    def exchange(name: str, frame, **options: str) -> None:
        writer = (frame.write.format("pipelined").mode("overwrite").option("exchange", name)
                  .option("partitioner", "hash").option("keys", "key"))
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()

    def exact() -> None:
        exchange("wide-exact", df, numSubpartitions=str(WIDTH))
        noop(spark.read.format("pipelined").option("exchange", "wide-exact").load())

    read_partitions: list[int] = []

    def coalesced() -> None:
        exchange("wide-coalesced", df)
        frame = spark.read.format("pipelined").option("exchange", "wide-coalesced").load()
        read_partitions.append(frame.rdd.getNumPartitions())
        noop(frame)

    cases = {"floor (no-op sink, 200 writes + prepared source, 200 reads)": floor,
             "parquet route (write, read, repartition(200, key))": parquet,
             "floor, workers' heap frozen as ours (reference)": frozen_floor,
             "spark repartition(200, key)": spark_shuffle,
             "pipelined exact (numSubpartitions=200, 200 reads)": exact,
             "pipelined coalesced (shuffle.partitions=200)": coalesced}
    for _ in range(args.warmup):
        for fn in cases.values():
            fn()
    load_before = os.getloadavg()[0]
    times = interleaved_rounds(spark, cases, args.repeat)
    runtime = TMP / "runtime"
    service_peak_200 = peak_mib(service_pids(runtime))
    worker_peak_200 = peak_mib(python_workers())

    # 2 producers x wide vs 2 x 8, write only (4,000 read tasks would measure Spark's per-task cost)
    two = rows(2)
    wide_times: dict[str, list[float]] = {"2 x 8 write": [], f"2 x {args.wide} write": []}
    for _ in range(args.repeat):
        for label, n in (("2 x 8 write", 8), (f"2 x {args.wide} write", args.wide)):
            settle(spark)
            start = time.perf_counter()
            exchange(f"wide-two-{n}", two, numSubpartitions=str(n))
            wide_times[label].append(time.perf_counter() - start)

            drop_exchange(f"wide-two-{n}")
    service_peak_all = peak_mib(service_pids(runtime))
    worker_peak_all = peak_mib(python_workers())
    load_after = os.getloadavg()[0]

    best = {label: min(t) for label, t in {**times, **wide_times}.items()}
    print(f"{args.rows:,} rows, local[2] on {os.cpu_count()} CPUs, best of {args.repeat}, "
          f"load average {load_before:.1f} before, {load_after:.1f} after")
    for label, secs in best.items():
        all_rounds = {**times, **wide_times}[label]
        print(f"  {label:62s} {secs:7.2f} s   [{' '.join(f'{t:.2f}' for t in all_rounds)}]")
    labels = list(cases)
    floor_l, parquet_l, frozen_l, shuffle_l, exact_l, coalesced_l = labels
    every = {**times, **wide_times}

    def ratio(num: str, den: str) -> tuple[float, float]:
        return best[num] / best[den], statistics.median(n / d for n, d in zip(every[num], every[den]))

    ratios = {
        "exact / floor": ratio(exact_l, floor_l),
        "coalesced / parquet route": ratio(coalesced_l, parquet_l),
        "exact / floor with the heap frozen as ours": ratio(exact_l, frozen_l),
        "frozen floor / floor": ratio(frozen_l, floor_l),
        "exact / parquet route": ratio(exact_l, parquet_l),
        "coalesced / spark repartition": ratio(coalesced_l, shuffle_l),
        "floor / parquet route": ratio(floor_l, parquet_l),
        f"2 x {args.wide} / 2 x 8 write": ratio(f"2 x {args.wide} write", "2 x 8 write"),
    }
    print(f"  {'ratio':62s} {'best':>7s} {'median of rounds':>17s}")
    for label, (of_best, of_rounds) in ratios.items():
        print(f"  {label:62s} {of_best:7.2f} {of_rounds:17.2f}")
    memory = {"service_peak_mib_200x200": round(service_peak_200, 1),
              "python_worker_peak_mib_200x200": round(worker_peak_200, 1),
              "service_peak_mib_incl_2x4000": round(service_peak_all, 1),
              "python_worker_peak_mib_incl_2x4000": round(worker_peak_all, 1),
              "coalesced_read_partitions": sorted(set(read_partitions))}
    print("  " + ", ".join(f"{k} {v}" for k, v in memory.items()))
    return {"rows": args.rows, "repeat": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M"), "master": "local[2]",
            "python_worker_sockets": "tcp" if args.tcp_workers else "unix",
            "cpus": os.cpu_count(), "loadavg_before_after": [load_before, load_after], "seconds": best,
            "all_seconds": every, "ratios": ratios, "memory": memory}


if __name__ == "__main__":
    main()
