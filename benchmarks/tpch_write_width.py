"""What a warm JVM write of a TPC-H producer's rows costs over Spark's ``noop`` sink, by subpartition count and codec.

One application (``local[2]``, the jar's catalog), the rows of ``tpch_pipeline.py``'s producer half of ``--query``
at ``--sf``. Each round writes them into ``noop`` and then, for every width in ``--widths`` and codec in
``--codecs``, into a fresh exchange through the catalog (``writeTo("exchange.<name>")``, hashed on the query's key
into that many subpartitions), dropping it after. The first round warms the JIT and the page cache and is not
counted. Reported: medians of the other rounds, each write's wall seconds and the driver JVM's CPU-seconds (every
thread, from ``/proc``), the service's CPU-seconds, and each over the ``noop`` write of the same round.

The hash partitioner at width 1 appends every row to one set of vectors; at the default width (200, Spark's
``spark.sql.shuffle.partitions``) every row goes to one of 200: the difference is what the split by
subpartition costs the writer. ``--set KEY=VALUE`` adds a table property to every exchange write (e.g.
``sortBufferSize=8m``); ``--jar`` runs another build of the plugin.

Run: .venv/bin/python benchmarks/tpch_write_width.py --sf 5 --query 3 [--widths 1,20,200] [--codecs none,zstd]
     [--rounds 5] [--set KEY=VALUE ...] [--jar PATH]
Writes benchmarks/tpch_write_width-latest.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sf", type=float, default=5.0)
    parser.add_argument("--query", type=int, default=3)
    parser.add_argument("--widths", default="1,20,200")
    parser.add_argument("--codecs", default="none,zstd")
    parser.add_argument("--rounds", type=int, default=5, help="rounds after the first (warm-up) one")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--jar", help="the plugin jar to run (default: the installed package's)")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    codecs = [c.strip() for c in args.codecs.split(",")]
    properties = dict(s.split("=", 1) for s in args.set)

    from spark_common import bench_environment, cpu_seconds, end_run

    tmp = bench_environment("write-width")
    import tpch_pipeline
    from pyspark.sql import SparkSession

    import sparkflow_exchange
    from sparkflow_exchange import SPARK_SETTINGS
    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.service.discovery import resolve
    from sparkflow_exchange.service.launcher import read_state

    data = tpch_pipeline.ensure_data(args.sf)
    spark = (SparkSession.builder.master("local[2]").appName("tpch-write-width")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "2g").config(map=SPARK_SETTINGS)
             .config("spark.jars", args.jar or sparkflow_exchange.plugin_jar())
             .config("spark.sql.catalog.exchange", tpch_pipeline.CATALOG).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for table in tpch_pipeline.TABLES:
            spark.read.parquet(str(data / f"{table}.parquet")).createOrReplaceTempView(table)
        query = tpch_pipeline.QUERIES[args.query]
        resolve(ExchangeConfig.load())  # this run's embedded service
        service = read_state(tmp / "runtime" / "embedded.json")["pid"]
        driver = int(spark._jvm.java.lang.ProcessHandle.current().pid())
        cases = ["noop"] + [f"{codec} x{width}" for codec in codecs for width in widths]
        seen: dict[str, list[dict]] = {case: [] for case in cases}
        count = 0
        for round_ in range(args.rounds + 1):
            for case in cases:
                df = spark.sql(query["producer"])
                service_before, cpu_before, started = cpu_seconds(service), cpu_seconds(driver), time.perf_counter()
                if case == "noop":
                    df.write.format("noop").mode("overwrite").save()
                else:
                    codec, width = case.split(" x")
                    count += 1
                    writer = (df.writeTo(f"exchange.width_{count}").tableProperty("keys", query["key"])
                              .tableProperty("numSubpartitions", width).tableProperty("compression", codec))
                    for key, value in properties.items():
                        writer = writer.tableProperty(key, value)
                    writer.createOrReplace()
                outcome = {"wall_s": time.perf_counter() - started, "jvm_cpu_s": cpu_seconds(driver) - cpu_before,
                           "service_cpu_s": cpu_seconds(service) - service_before}
                if case != "noop":
                    spark.sql(f"DROP TABLE exchange.width_{count}")
                if round_ > 0:
                    seen[case].append(outcome)
                print(f"round {round_}{' (warm-up)' if round_ == 0 else ''} {case}: {outcome['wall_s']:.2f} s, "
                      f"JVM {outcome['jvm_cpu_s']:.2f} CPU-s, service {outcome['service_cpu_s']:.2f}", flush=True)
    finally:
        end_run(spark, tmp)

    def median(case: str, key: str) -> float:
        return statistics.median(o[key] for o in seen[case])

    noop_wall, noop_cpu = median("noop", "wall_s"), median("noop", "jvm_cpu_s")
    print(f"\nsf {args.sf:g} Q{args.query}'s producer rows, medians of {args.rounds} warm rounds"
          + (f", table properties {properties}" if properties else "") + "\n")
    print("| write | wall s | JVM CPU-s | service CPU-s | wall over noop | JVM CPU over noop |")
    print("|---|---:|---:|---:|---:|---:|")
    summary = {}
    for case in cases:
        wall, cpu, svc = median(case, "wall_s"), median(case, "jvm_cpu_s"), median(case, "service_cpu_s")
        summary[case] = {"wall_s": wall, "jvm_cpu_s": cpu, "service_cpu_s": svc}
        over = "" if case == "noop" else f"+{wall - noop_wall:.2f} | +{cpu - noop_cpu:.2f}"
        print(f"| {case} | {wall:.2f} | {cpu:.2f} | {svc:.2f} | " + (over or "– | –") + " |")
    out = {"sf": args.sf, "query": args.query, "widths": widths, "codecs": codecs, "rounds": args.rounds,
           "properties": properties, "jar": args.jar, "summary": summary, "runs": seen}
    (HERE / "tpch_write_width-latest.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
