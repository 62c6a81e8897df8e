"""Skewed keys at Spark's ordinary width: a coalesced read with and without ``splitSkewedSubpartitions``.

One session (``local[2]``, AQE off, the recommended Arrow setting), ``--rows`` rows (long id, long key, a
16-character string, a double) in 200 partitions, ``--hot`` of them on one key; written with
``format("pipelined")`` hash on key without ``numSubpartitions`` under ``spark.sql.shuffle.partitions=200``
(so the read coalesces). Each read ends in an aggregation Spark finishes itself (``groupBy(key)``: the
split changes nothing in its answer, which is checked equal across cases). Cases, interleaved per round,
median of ``--repeat`` after a warm-up round:

* coalesced: the read as planned by default (the hot subpartition is one read task);
* split: the same read with ``splitSkewedSubpartitions=true`` (the hot subpartition read by several
  tasks, each a range of the 200 producers);
* parquet route: write parquet, read, ``repartition(200, key)``, the same aggregation (Spark's own
  shuffle has the same one-task hot partition without AQE's skew join).

Both reads take ``--advisory`` (16 MiB) and the split one ``--threshold`` (16 MiB): at 4 M rows the hot
subpartition holds about 100 MB, under Spark's default 256 MiB threshold. With 2 cores a hot key only
costs time when it holds more than half of the rows (``--hot``, default 0.6).

Run: .venv/bin/python benchmarks/skew.py [--rows 4000000] [--hot 0.6] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("skew")  # before Spark starts: its workers and embedded service are this run's

from pyspark.sql import functions as F  # noqa: E402
from spark_common import end_run, interleaved_rounds, wide_session  # noqa: E402

WIDTH = 200
HOT_KEY = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--hot", type=float, default=0.6, help="share of the rows on the hot key")
    parser.add_argument("--advisory", default="16m", help="advisoryPartitionSize of both reads")
    parser.add_argument("--threshold", default="16m", help="skewedPartitionThreshold of the split read")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "skew-latest.json"))
    args = parser.parse_args()
    spark = None
    results: dict = {"rows": args.rows, "hot": args.hot, "advisory": args.advisory, "threshold": args.threshold}
    try:
        spark = wide_session("sparkflow-bench-skew", WIDTH)
        results.update(run(spark, args))
    finally:
        end_run(spark, TMP)
    Path(args.out).write_text(json.dumps(results, indent=2))


def run(spark, args) -> dict:
    hot_mod = max(1, round(1 / args.hot)) if args.hot > 0 else 0
    key = f"CASE WHEN id % {hot_mod} = 0 THEN {HOT_KEY} ELSE id % 100003 END" if hot_mod else "id % 100003"
    df = spark.range(0, args.rows, 1, WIDTH).selectExpr(
        "id", f"{key} AS key", "lpad(CAST(id AS STRING), 16, 'x') AS s", "rand(7) AS d")
    (df.write.format("pipelined").mode("overwrite").option("exchange", "skew").option("partitioner", "hash")
       .option("keys", "key").save())
    src = str(TMP / "parquet")

    def agg(frame):
        return sorted(tuple(r) for r in frame.groupBy("key").agg(F.count("*"), F.sum("id")).collect())

    def pipelined(**options):
        reader = spark.read.format("pipelined").option("exchange", "skew") \
            .option("advisoryPartitionSize", args.advisory).option("skewedPartitionThreshold", args.threshold)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    def parquet_route():
        df.write.mode("overwrite").parquet(src)
        return agg(spark.read.parquet(src).repartition(WIDTH, "key"))

    cases = {"coalesced": lambda: agg(pipelined()),
             "split": lambda: agg(pipelined(splitSkewedSubpartitions="true")),
             "parquet route": parquet_route}
    tasks = {"coalesced": pipelined().rdd.getNumPartitions(),
             "split": pipelined(splitSkewedSubpartitions="true").rdd.getNumPartitions()}
    answers = {name: fn() for name, fn in cases.items()}  # warm-up round, and the answers compared
    if len({json.dumps(a) for a in answers.values()}) != 1:
        raise AssertionError("the cases disagree on the aggregation")
    times = interleaved_rounds(spark, cases, args.repeat)
    median = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        extra = f" ({tasks[name]} read tasks)" if name in tasks else ""
        print(f"{name:14s} median {median[name]:6.2f} s  rounds {' '.join(f'{x:.2f}' for x in t)}{extra}")
    print(f"split / coalesced = {median['split'] / median['coalesced']:.2f}; "
          f"split / parquet route = {median['split'] / median['parquet route']:.2f}")
    return {"seconds": times, "median": median, "read_tasks": tasks,
            "split_over_coalesced": median["split"] / median["coalesced"]}


if __name__ == "__main__":
    main()
