"""The TPC-H benchmark's exchanges per codec: their bytes against the same rows' parquet files, and their time.

One application (``local[2]``, ``SPARK_SETTINGS``, the plugin jar and its catalog) on ``tpch_pipeline.py``'s data
(``tpchgen-cli`` parquet; ``--data DIR`` for tables generated elsewhere). For each query of ``tpch_pipeline.QUERIES``
the producer half is computed once and cached with the partitions the pipeline's producer writes from (adaptive
execution may coalesce a cached plan's partitions, as it does the pipeline's uncached one: a cached plan keeps
``spark.sql.shuffle.partitions`` tasks otherwise, and each task's buffers get that many times smaller); its rows are
then written as the ``jvm`` route writes them (``df.writeTo("exchange.<name>")`` hashed on the query's key into
``--subpartitions``) with every codec, each read back whole through the JVM reader into Spark's ``noop`` sink, and
written as parquet (Spark's default, snappy) as the pipeline's ``parquet`` route writes them. Codecs and parquet
alternate within each round (reversed every other round); times are medians of ``--rounds``, wall and the
application JVM's CPU seconds (``/proc``: what the codecs cost, less moved by other load than wall time).
Reported per query and codec: the exchange's bytes (what the service holds, what a reader moves), their ratio to the
parquet files' bytes, write and read seconds and the pair's time against ``none``.

Run: .venv/bin/python benchmarks/tpch_compression.py [--sf 5] [--data DIR] [--queries 3,5,9,18] [--rounds 3]
Writes benchmarks/tpch_compression-latest.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CODECS = ("none", "lz4", "zstd")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sf", type=float, default=5)
    parser.add_argument("--queries", default="3,5,9,18")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--subpartitions", type=int, default=200)
    parser.add_argument("--data", help="a directory of the TPC-H tables as <table>.parquet (default: generated once)")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import tpch_pipeline
    from spark_common import bench_environment, cpu_seconds, end_run

    data = Path(args.data) if args.data else tpch_pipeline.ensure_data(args.sf)
    tmp = bench_environment("tpch-compression")
    from pyspark.sql import SparkSession

    import sparkflow_exchange
    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.service.discovery import resolve
    from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

    resolve(ExchangeConfig.load())
    spark = (SparkSession.builder.master("local[2]").appName("tpch-compression")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.subpartitions))
             .config("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
             .config(map=SPARK_SETTINGS).config("spark.jars", sparkflow_exchange.plugin_jar())
             .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    for table in tpch_pipeline.TABLES:
        spark.read.parquet(str(data / f"{table}.parquet")).createOrReplaceTempView(table)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    def jvm_cpu() -> float:
        """The application JVM's CPU seconds so far (user + system)."""
        return cpu_seconds(jvm_pid)

    out: dict = {"sf": args.sf, "rounds": args.rounds, "subpartitions": args.subpartitions, "queries": {}}
    routes = (*CODECS, "parquet")
    for q in (int(x) for x in args.queries.split(",")):
        query = tpch_pipeline.QUERIES[q]
        df = spark.sql(query["producer"]).cache()
        rows = df.count()
        key = query["key"]
        producers = 0
        times = {r: {"write": [], "read": [], "write_cpu": [], "read_cpu": []} for r in routes}
        held: dict[str, int] = {}
        for r in range(args.rounds):
            for route in (routes if r % 2 == 0 else routes[::-1]):
                name = f"tq{q}_{route}"
                path = tmp / name
                started, cpu = time.perf_counter(), jvm_cpu()
                if route == "parquet":
                    shutil.rmtree(path, ignore_errors=True)
                    df.write.parquet(str(path))
                else:
                    df.writeTo(f"exchange.{name}").tableProperty("keys", key) \
                        .tableProperty("numSubpartitions", str(args.subpartitions)) \
                        .tableProperty("compression", route).createOrReplace()
                times[route]["write"].append(time.perf_counter() - started)
                times[route]["write_cpu"].append(jvm_cpu() - cpu)
                started, cpu = time.perf_counter(), jvm_cpu()
                source = spark.read.parquet(str(path)) if route == "parquet" else spark.table(f"exchange.{name}")
                source.write.format("noop").mode("overwrite").save()
                times[route]["read"].append(time.perf_counter() - started)
                times[route]["read_cpu"].append(jvm_cpu() - cpu)
                if route == "parquet":
                    held[route] = sum(p.stat().st_size for p in path.glob("*.parquet"))
                else:
                    summary = next(s for s in sparkflow_exchange.list_exchanges() if s.name == name)
                    assert summary.rows == rows, (summary.rows, rows)
                    held[route] = summary.bytes
                    producers = summary.producers  # the write tasks: each fills its own buffers per subpartition
                print(f"Q{q} round {r} {route}: {held[route] / 1e6:.1f} MB, write {times[route]['write'][-1]:.2f} s,"
                      f" read {times[route]['read'][-1]:.2f} s, cpu {times[route]['write_cpu'][-1]:.2f} +"
                      f" {times[route]['read_cpu'][-1]:.2f} s", flush=True)
        df.unpersist()
        entry = {"rows": rows, "producers": producers, "routes": {}}
        med = {r: {k: statistics.median(v) for k, v in t.items()} for r, t in times.items()}
        base = med["none"]["write"] + med["none"]["read"]
        base_cpu = med["none"]["write_cpu"] + med["none"]["read_cpu"]
        for route in routes:
            m = med[route]
            entry["routes"][route] = {"bytes": held[route], "vs_parquet": held[route] / held["parquet"],
                                      "write_s": m["write"], "read_s": m["read"],
                                      "pair_vs_none": (m["write"] + m["read"]) / base,
                                      "write_cpu_s": m["write_cpu"], "read_cpu_s": m["read_cpu"],
                                      "cpu_vs_none": (m["write_cpu"] + m["read_cpu"]) / base_cpu, **times[route]}
        out["queries"][q] = entry
        (HERE / "tpch_compression-latest.json").write_text(json.dumps(out, indent=1))
    end_run(spark, tmp)
    print(f"\nTPC-H sf {args.sf:g}, {args.subpartitions} subpartitions, medians of {args.rounds}")
    print("| query | rows (producers) | route | MB | vs parquet | write s | read s | pair vs none | write CPU s |"
          " read CPU s | pair CPU vs none |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for q, entry in out["queries"].items():
        for route, r in entry["routes"].items():
            print(f"| Q{q} | {entry['rows']:,} ({entry['producers']}) | {route} | {r['bytes'] / 1e6:,.1f} | "
                  f"{r['vs_parquet']:.2f} | {r['write_s']:.2f} | {r['read_s']:.2f} | {r['pair_vs_none']:.2f} | "
                  f"{r['write_cpu_s']:.2f} | {r['read_cpu_s']:.2f} | {r['cpu_vs_none']:.2f} |")


if __name__ == "__main__":
    main()
