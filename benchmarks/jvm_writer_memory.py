"""The JVM writer's Arrow memory against the number of subpartitions it writes.

Each case is a fresh application (``local[2]``, ``SPARK_SETTINGS``, the plugin jar and its catalog) that writes
the same rows (``spark_common.bench_rows``: long id, long key, a 16-character string, a double; two write tasks)
through ``df.writeTo("exchange.<name>")``, hashed on ``key`` into N subpartitions. Reported per case: the peak
Arrow memory of the application's JVM (``ArrowUtils.rootAllocator()``, whose child allocators the JVM writer's
tasks use; nothing else in the application allocates Arrow memory), the write's seconds, the exchange's Arrow
bytes, and the peak's ratio to the 8-subpartition case of the same run (best of ``--repeat`` interleaved rounds).
A writer holds each target's rows in Arrow vectors until ``bufferSize`` or ``sortBufferSize`` sends them: what it
holds before any is sent is the vectors' first allocation, one per target.

Run: .venv/bin/python benchmarks/jvm_writer_memory.py [--rows 200000] [--subs 8,200,2000] [--repeat 2]
Writes benchmarks/jvm_writer_memory-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _child(subs: int, rows: int) -> dict:
    """One fresh application: one write of ``rows`` into ``subs`` subpartitions."""
    sys.path.insert(0, str(HERE))
    from spark_common import bench_environment, bench_rows, end_run

    tmp = bench_environment(f"jvm-writer-memory-{subs}")
    from pyspark.sql import SparkSession

    import sparkflow_exchange
    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.service.discovery import resolve
    from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

    resolve(ExchangeConfig.load())  # the JVM writer finds the host's service and starts none
    spark = (SparkSession.builder.master("local[2]").appName(f"jvm-writer-memory-{subs}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config(map=SPARK_SETTINGS).config("spark.jars", sparkflow_exchange.plugin_jar())
             .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = bench_rows(spark, rows, 2)
    started = time.perf_counter()
    df.writeTo("exchange.memory").tableProperty("keys", "key").tableProperty("numSubpartitions", str(subs)) \
        .createOrReplace()
    seconds = time.perf_counter() - started
    peak = spark._jvm.org.apache.spark.sql.util.ArrowUtils.rootAllocator().getPeakMemoryAllocation()
    summary = next(s for s in sparkflow_exchange.list_exchanges() if s.name == "memory")
    end_run(spark, tmp)
    return {"peak_bytes": peak, "seconds": seconds, "exchange_bytes": summary.bytes, "rows": summary.rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--subs", default="8,200,2000", help="subpartition counts, the first is the baseline")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args.child, args.rows)), flush=True)
        return
    widths = [int(s) for s in args.subs.split(",") if s.strip()]
    if not widths or min(widths) < 1:
        parser.error(f"--subs needs positive subpartition counts, got {args.subs!r}")
    load_before = os.getloadavg()
    runs: dict[int, list[dict]] = {w: [] for w in widths}
    for round_ in range(args.repeat):
        for width in widths:  # interleaved: a slow spell of the machine falls on every case
            out = subprocess.run([sys.executable, __file__, "--child", str(width), "--rows", str(args.rows)],
                                 capture_output=True, text=True, timeout=900)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if out.returncode != 0 or line is None:
                sys.exit(f"{width} subpartitions failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            runs[width].append(json.loads(line[7:]))
            r = runs[width][-1]
            print(f"round {round_ + 1}, {width} subpartitions: peak {r['peak_bytes'] / 2**20:.1f} MiB, "
                  f"{r['seconds']:.2f} s, exchange {r['exchange_bytes'] / 2**20:.1f} MiB", flush=True)
    best = {w: {"peak_bytes": min(r["peak_bytes"] for r in rs), "seconds": min(r["seconds"] for r in rs),
                "exchange_bytes": rs[0]["exchange_bytes"], "rows": rs[0]["rows"]} for w, rs in runs.items()}
    base = best[widths[0]]["peak_bytes"]
    print(f"\nbest of {args.repeat}, {args.rows:,} rows, 2 write tasks (load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f})\n")
    print(f"| subpartitions | peak Arrow memory | vs {widths[0]} | write s | exchange |")
    print("|---|---:|---:|---:|---:|")
    for w, b in best.items():
        print(f"| {w:,} | {b['peak_bytes'] / 2**20:.1f} MiB | {b['peak_bytes'] / base:.2f} | {b['seconds']:.2f} | "
              f"{b['exchange_bytes'] / 2**20:.1f} MiB |")
    (HERE / "jvm_writer_memory-latest.json").write_text(json.dumps(
        {"rows": args.rows, "repeat": args.repeat, "best": best, "runs": runs, "load_before": load_before,
         "load_after": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
