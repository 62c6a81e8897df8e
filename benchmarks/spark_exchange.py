"""Spark benchmark: 10 million rows hash-exchanged to 8 subpartitions, beside baselines in ONE session.

Rows: long id, long key (id % 100003), a 16-character string, a double. Cases, every one ending in
``write.format("noop")`` so all rows flow through the measured action:

* floor: the generated DataFrame into a no-op Arrow sink (a ``DataSourceArrowWriter`` that discards),
  then a reader data source yielding prepared Arrow batches of the same rows (Arrow IPC files prepared
  before timing, memory-mapped, batches of about ``bufferSize`` bytes like the exchange's): the cost
  of moving the rows through Python data sources at all, out and back in;
* parquet: write to local disk, read, ``repartition(8, "key")``;
* spark repartition: Spark's own ``repartition(8, "key")`` of the generated DataFrame (its shuffle);
* pipelined HYBRID: ``df.write.format("pipelined")`` (hash on key, 8 subpartitions), then read;
* pipelined PIPELINED_BOUNDED: the read (thread started first, waiting for the declaration) while the
  write runs in another thread.

Session: the recommended ``SPARK_SETTINGS`` (``sparkflow_exchange/spark/session_tuning.py``): Unix sockets to the
Python workers (Spark's TCP default stalls ~84 ms per Python task on delayed ACKs) and
``spark.sql.execution.arrow.maxBytesPerBatch=2147483647`` (Spark stops measuring each Arrow batch after
every row it adds, about a third of the JVM's time on a Python data source's write). Both are
session-wide, so the floor gets them too; parquet and Spark's shuffle use neither.
``--spark-defaults`` leaves both at Spark's defaults instead.
``local[10]`` on this 2-core machine. A pipelined read and its write run at once and need
slots at once: 8 read tasks (one per subpartition) + 2 write tasks (the DataFrame has 2 partitions,
one per core). Every case uses the same session; AQE is off so plans do not change between rounds.
Rounds are interleaved (each round runs every case once) after ``--warmup`` untimed rounds; before
each case the previous one's dirty pages are synced and the driver JVM collects its garbage; best of
``--repeat``, and the median of the per-round ratios.
The embedded exchange service runs from a temp runtime dir; it is stopped by pid and the dir removed.

Run: .venv/bin/python benchmarks/spark_exchange.py [--rows 10000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("spark")  # before Spark starts: its workers and embedded service are this run's

from pyspark.sql import SparkSession  # noqa: E402
from spark_common import (  # noqa: E402
    NoopArrowSink,
    PreparedBatches,
    bench_rows,
    end_run,
    interleaved_rounds,
    prepare_floor_files,
)

N_SUB = 8
SLOTS = 10
WRITE_PARTITIONS = 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed rounds first (the JVM's JIT compiles on the same 2 cores for a while)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "spark_exchange-latest.json"))
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for the session (repeatable)")
    parser.add_argument("--only", default="", help="run only cases whose label contains one of these, comma separated")
    parser.add_argument("--spark-defaults", action="store_true",
                        help="leave the recommended SPARK_SETTINGS at Spark's defaults (TCP workers, per-row batch measurement)")
    args = parser.parse_args()
    spark = None
    try:
        from sparkflow_exchange.config import ExchangeConfig

        buffer_size = ExchangeConfig().buffer_size
        prepare_floor_files(args.rows, TMP / "floor", buffer_size, N_SUB)
        spark = (SparkSession.builder.master(f"local[{SLOTS}]").appName("sparkflow-bench")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", str(N_SUB))
                 .config("spark.sql.adaptive.enabled", "false").config("spark.driver.memory", "3g"))
        if not args.spark_defaults:  # the recommended settings, before the user's --conf
            from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

            args.conf[:0] = [f"{k}={v}" for k, v in SPARK_SETTINGS.items()]
        for item in args.conf:
            key, _, value = item.partition("=")
            spark = spark.config(key, value)
        spark = spark.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        results = run(spark, args, buffer_size)
    finally:
        end_run(spark, TMP)
    Path(args.out).write_text(json.dumps(results, indent=2))


def run(spark: SparkSession, args: argparse.Namespace, buffer_size: int) -> dict:
    spark.dataSource.register(NoopArrowSink)
    spark.dataSource.register(PreparedBatches)
    df = bench_rows(spark, args.rows, WRITE_PARTITIONS)
    parquet_dir = TMP / "parquet"

    def noop(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def floor() -> None:
        df.write.format("floor_sink").mode("append").save()
        noop(spark.read.format("floor_source").option("dir", str(TMP / "floor")).option("parts", str(N_SUB)).load())

    def parquet() -> None:
        df.write.mode("overwrite").parquet(str(parquet_dir))
        noop(spark.read.parquet(str(parquet_dir)).repartition(N_SUB, "key"))

    def spark_shuffle() -> None:
        noop(df.repartition(N_SUB, "key"))

    def write_exchange(name: str, partition_type: str) -> None:
        (df.write.format("pipelined").mode("overwrite").option("exchange", name).option("partitioner", "hash")
           .option("keys", "key").option("numSubpartitions", str(N_SUB)).option("partitionType", partition_type)
           .save())

    def read_exchange(name: str) -> None:
        noop(spark.read.format("pipelined").option("exchange", name).option("declareTimeout", "120s").load())

    def hybrid() -> None:
        write_exchange("bench-hybrid", "HYBRID")
        read_exchange("bench-hybrid")

    counter = [0]

    def in_thread(fn, *fn_args) -> tuple[threading.Thread, list]:
        errors: list[BaseException] = []

        def body() -> None:
            try:
                spark._jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(spark._jsparkSession)
                fn(*fn_args)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                errors.append(exc)

        thread = threading.Thread(target=body)
        thread.start()
        return thread, errors

    def pipelined() -> None:
        counter[0] += 1
        name = f"bench-pipelined-{counter[0]}"
        reader, read_errors = in_thread(read_exchange, name)
        time.sleep(0.2)  # the read is being planned: it waits for the write's declaration
        writer, write_errors = in_thread(write_exchange, name, "PIPELINED_BOUNDED")
        writer.join()
        reader.join()
        if write_errors or read_errors:
            raise (write_errors or read_errors)[0]

    cases = {"floor (no-op Arrow sink + prepared Arrow batches)": floor,
             "parquet (write, read, repartition(8, key))": parquet,
             "spark repartition(8, key)": spark_shuffle,
             "pipelined HYBRID (write, then read)": hybrid,
             "pipelined PIPELINED_BOUNDED (read while written)": pipelined}
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = {label: fn for label, fn in cases.items() if any(w in label for w in wanted)}
    for _ in range(args.warmup):  # JVM code paths and JIT, Python workers, imports, the embedded service
        for fn in cases.values():
            fn()
    load_before = os.getloadavg()[0]
    times = interleaved_rounds(spark, cases, args.repeat)
    load_after = os.getloadavg()[0]
    best = {label: min(t) for label, t in times.items()}
    print(f"{args.rows:,} rows, local[{SLOTS}] on {os.cpu_count()} CPUs, best of {args.repeat}, "
          f"load average {load_before:.1f} before, {load_after:.1f} after; settings {args.conf}")
    for label, secs in best.items():
        print(f"  {label:52s} {secs:7.2f} s   [{' '.join(f'{t:.2f}' for t in times[label])}]")
    if len(best) < 5:
        return {"rows": args.rows, "conf": args.conf, "seconds": best, "all_seconds": times}
    floor, parquet = "floor (no-op Arrow sink + prepared Arrow batches)", "parquet (write, read, repartition(8, key))"
    hybrid, pipelined = "pipelined HYBRID (write, then read)", "pipelined PIPELINED_BOUNDED (read while written)"
    shuffle = "spark repartition(8, key)"

    def ratio(num: str, den: str) -> tuple[float, float]:
        """(best / best, median of the per-round ratios): cases of one round ran back to back."""
        return best[num] / best[den], statistics.median(n / d for n, d in zip(times[num], times[den]))

    ratios = {
        "HYBRID / parquet": ratio(hybrid, parquet),
        "HYBRID / floor": ratio(hybrid, floor),
        "PIPELINED_BOUNDED / parquet": ratio(pipelined, parquet),
        "PIPELINED_BOUNDED / floor": ratio(pipelined, floor),
        "floor / parquet (what any Python data source pays)": ratio(floor, parquet),
        "HYBRID / spark repartition": ratio(hybrid, shuffle),
        "PIPELINED_BOUNDED / spark repartition": ratio(pipelined, shuffle),
    }
    print(f"  {'ratio':52s} {'best':>7s} {'median of rounds':>17s}")
    for label, (of_best, of_rounds) in ratios.items():
        print(f"  {label:52s} {of_best:7.2f} {of_rounds:17.2f}")
    return {"rows": args.rows, "repeat": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M"),
            "master": f"local[{SLOTS}]", "conf": args.conf, "cpus": os.cpu_count(), "buffer_size": buffer_size,
            "loadavg_before_after": [load_before, load_after], "seconds": best, "all_seconds": times,
            "ratios": ratios}


if __name__ == "__main__":
    main()
