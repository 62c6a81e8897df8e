"""Compression through the JVM writer and reader: bytes held and write/read time for none, lz4 and zstd.

One application (``local[2]``, ``SPARK_SETTINGS``, the plugin jar and its catalog). The table is cached first, so
the times are the exchange's, not parquet's: TPC-H ``lineitem`` (``tpchgen-cli``, all 16 columns; ``--data tpch``)
or, for the incompressible case, rows of random longs and doubles (``--data random`` with a sequential long
column, ``--data noise`` without). Each round writes it with
every codec through ``df.writeTo("exchange.<name>")`` hashed on the first column into 8 subpartitions, then reads
it back whole through the JVM reader (``spark.table(...)`` into Spark's ``noop`` sink: every column decoded).
Reported per codec: the exchange's bytes (what the service holds and a reader moves), their ratio to the
uncompressed exchange and to the parquet files, the write's and the read's seconds (median of ``--rounds``,
codecs interleaved within a round), and the pair's time against ``none``; the same for the application JVM's CPU
seconds (``/proc``: what the codecs cost, less moved by other load on the machine than wall time). With
``--compare-thread`` each codec writes twice in the same rounds: ``lz4``, ``zstd`` with ``compressionThread=true``
(compressed and pushed on each writer's push thread) and ``lz4/task``, ``zstd/task`` with ``compressionThread=false``
(on the task's own thread, the default); without it, the codecs write with the default.

Run: .venv/bin/python benchmarks/jvm_compression.py [--data tpch] [--sf 0.5] [--rows 3000000] [--rounds 3]
     [--compare-thread]
Writes benchmarks/jvm_compression-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CODECS = ("none", "lz4", "zstd")


def lineitem(sf: float) -> Path:
    """TPC-H ``lineitem`` at ``sf`` as parquet files in benchmarks/.tpch/lineitem-sf<sf>, generated once."""
    target = HERE / ".tpch" / f"lineitem-sf{sf:g}"
    if not any(target.glob("**/*.parquet")):
        tool = Path(sys.executable).parent / "tpchgen-cli"
        if not tool.exists():
            sys.exit("tpchgen-cli is missing: .venv/bin/python -m pip install tpchgen-cli")
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(tool), "parquet", "--scale-factor", f"{sf:g}", "--tables", "lineitem",
                        "--output-dir", str(target)], check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=("tpch", "random", "noise"), default="tpch",
                        help="random: a sequential long, two 64-bit hashes, two random doubles; noise: no sequential "
                             "column (three hashes, two random doubles), what no codec shrinks")
    parser.add_argument("--sf", type=float, default=0.5, help="TPC-H scale factor of lineitem (--data tpch)")
    parser.add_argument("--rows", type=int, default=3_000_000, help="rows (--data random)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare-thread", action="store_true",
                        help="also write each codec with compressionThread=false (on the task's thread)")
    args = parser.parse_args()
    routes = CODECS + (tuple(f"{c}/task" for c in CODECS if c != "none") if args.compare_thread else ())
    sys.path.insert(0, str(HERE))
    from spark_common import bench_environment, cpu_seconds, end_run

    source = lineitem(args.sf) if args.data == "tpch" else None
    tmp = bench_environment("jvm-compression")
    from pyspark.sql import SparkSession

    import sparkflow_exchange
    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.service.discovery import resolve
    from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

    resolve(ExchangeConfig.load())
    spark = (SparkSession.builder.master("local[2]").appName("jvm-compression")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config(map=SPARK_SETTINGS).config("spark.jars", sparkflow_exchange.plugin_jar())
             .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    if source is not None:
        df = spark.read.parquet(str(source))
        parquet_bytes = sum(p.stat().st_size for p in source.glob("**/*.parquet"))
    else:
        first = "id" if args.data == "random" else "xxhash64(id, 2) AS c"
        df = spark.range(0, args.rows, 1, 4).selectExpr(first, "xxhash64(id) AS a", "xxhash64(id, 1) AS b",
                                                        "rand(7) AS d", "rand(8) AS e")
        parquet_bytes = None
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    def jvm_cpu() -> float:
        """The application JVM's CPU seconds so far (user + system)."""
        return cpu_seconds(jvm_pid)

    df = df.repartition(4).cache()
    rows = df.count()
    key = df.columns[0]
    times: dict[str, dict[str, list[float]]] = {c: {"write": [], "read": [], "write_cpu": [], "read_cpu": []}
                                                for c in routes}
    held: dict[str, int] = {}
    for r in range(args.rounds):
        for codec in (routes if r % 2 == 0 else routes[::-1]):
            name = f"z_{codec.replace('/', '_')}"
            started, cpu = time.perf_counter(), jvm_cpu()
            writer = df.writeTo(f"exchange.{name}").tableProperty("keys", key) \
                .tableProperty("numSubpartitions", "8").tableProperty("compression", codec.split("/")[0])
            if args.compare_thread:
                writer = writer.tableProperty("compressionThread", str(not codec.endswith("/task")).lower())
            writer.createOrReplace()
            times[codec]["write"].append(time.perf_counter() - started)
            times[codec]["write_cpu"].append(jvm_cpu() - cpu)
            started, cpu = time.perf_counter(), jvm_cpu()
            spark.table(f"exchange.{name}").write.format("noop").mode("overwrite").save()
            times[codec]["read"].append(time.perf_counter() - started)
            times[codec]["read_cpu"].append(jvm_cpu() - cpu)
            summary = next(s for s in sparkflow_exchange.list_exchanges() if s.name == name)
            assert summary.rows == rows, (summary.rows, rows)
            held[codec] = summary.bytes
            print(f"round {r} {codec}: {summary.bytes / 2**20:.1f} MiB, write {times[codec]['write'][-1]:.2f} s, "
                  f"read {times[codec]['read'][-1]:.2f} s, cpu {times[codec]['write_cpu'][-1]:.2f} + "
                  f"{times[codec]['read_cpu'][-1]:.2f} s", flush=True)
    end_run(spark, tmp)
    out = {"data": args.data, "sf": args.sf if source else None, "rows": rows, "rounds": args.rounds,
           "parquet_bytes": parquet_bytes, "load_average": os.getloadavg(), "codecs": {}}
    med = {c: {k: statistics.median(v) for k, v in t.items()} for c, t in times.items()}
    base = med["none"]["write"] + med["none"]["read"]
    base_cpu = med["none"]["write_cpu"] + med["none"]["read_cpu"]
    print(f"\n{rows:,} rows ({args.data}), median of {args.rounds}, load average {os.getloadavg()}")
    print("| codec | exchange MiB | vs none | vs parquet | write s | read s | pair vs none | write CPU s | read CPU s |"
          " pair CPU vs none |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for codec in routes:
        m = med[codec]
        w, rd = m["write"], m["read"]
        entry = {"bytes": held[codec], "write_s": w, "read_s": rd, "write_cpu_s": m["write_cpu"],
                 "read_cpu_s": m["read_cpu"], **times[codec]}
        out["codecs"][codec] = entry
        vs_parquet = f"{held[codec] / parquet_bytes:.2f}" if parquet_bytes else "-"
        print(f"| {codec} | {held[codec] / 2**20:,.1f} | {held[codec] / held['none']:.2f} | {vs_parquet} | "
              f"{w:.2f} | {rd:.2f} | {(w + rd) / base:.2f} | {m['write_cpu']:.2f} | {m['read_cpu']:.2f} | "
              f"{(m['write_cpu'] + m['read_cpu']) / base_cpu:.2f} |")
    (HERE / "jvm_compression-latest.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
