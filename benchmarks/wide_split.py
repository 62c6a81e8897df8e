"""The exact 200 x 200 case of spark_wide.py split by side: 200 write tasks and 200 read tasks, each against the floor's.

Same session and rows as ``spark_wide.py`` (``local[2]``, 4 M rows, 200 x 200); interleaved rounds, each case
from a settled state: the exchange's write (``numSubpartitions=200``) against the floor's no-op sink, and
its read (200 read tasks into ``noop``) against the floor's prepared source. Where the exact case's time
over the floor goes.

Run: .venv/bin/python benchmarks/wide_split.py [--rows 4000000] [--repeat 3] [--tcp-workers]
"""
from __future__ import annotations

import argparse
import statistics

from spark_common import bench_environment

TMP = bench_environment("wide-split")  # before Spark starts

from spark_common import (  # noqa: E402
    NoopArrowSink,
    PreparedBatches,
    bench_rows,
    end_run,
    interleaved_rounds,
    prepare_floor_files,
    wide_session,
)

WIDTH = 200


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tcp-workers", action="store_true",
                        help="Spark's default TCP sockets to its Python workers (recommended: Unix sockets)")
    args = parser.parse_args()
    spark = None
    try:
        from sparkflow_exchange.config import ExchangeConfig

        prepare_floor_files(args.rows, TMP / "floor", ExchangeConfig().buffer_size, WIDTH)
        spark = wide_session("sparkflow-bench-wide-split", WIDTH, args.tcp_workers)
        for source in (NoopArrowSink, PreparedBatches):
            spark.dataSource.register(source)
        df = bench_rows(spark, args.rows, WIDTH)

        def exact_write() -> None:
            (df.write.format("pipelined").mode("overwrite").option("exchange", "split-exact").option("keys", "key")
             .option("numSubpartitions", str(WIDTH)).save())

        def exact_read() -> None:
            spark.read.format("pipelined").option("exchange", "split-exact").load().write.format("noop") \
                .mode("overwrite").save()

        def floor_write() -> None:
            df.write.format("floor_sink").mode("append").save()

        def floor_read() -> None:
            (spark.read.format("floor_source").option("dir", str(TMP / "floor")).option("parts", str(WIDTH)).load()
             .write.format("noop").mode("overwrite").save())

        cases = {"exact write": exact_write, "floor write": floor_write, "exact read": exact_read,
                 "floor read": floor_read}
        for fn in cases.values():  # warm-up
            fn()
        times = interleaved_rounds(spark, cases, args.repeat)
        for label, t in times.items():
            print(f"  {label:12s} best {min(t):6.2f} s  median {statistics.median(t):6.2f} s  "
                  f"[{' '.join(f'{x:.2f}' for x in t)}]")
        for side in ("write", "read"):
            ours, floor = times[f"exact {side}"], times[f"floor {side}"]
            print(f"  exact / floor {side}: best {min(ours) / min(floor):.2f}, median of rounds "
                  f"{statistics.median(o / f for o, f in zip(ours, floor)):.2f}")
    finally:
        end_run(spark, TMP)


if __name__ == "__main__":
    main()
