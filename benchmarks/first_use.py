"""A fresh application's first write and first read: what a short job pays before its rows move.

Each case is a fresh Python process with a fresh SparkSession (``local[2]``, ``SPARK_SETTINGS``) and, for
the exchange, a fresh runtime directory (so its first write starts the embedded service, as a user's
first application does); ``pipelined-served`` starts that service before the session, as a host that runs
``sparkflow-exchange serve`` (or an earlier application's embedded service, still up) has it. After the session is up, it times:

* the first write of 100,000 rows (4 tasks), then a second write of the same rows (warm);
* the first read of what it wrote (4 tasks, into ``format("noop")``), then a second read.

Routes: the exchange (``format("pipelined")``); two floors, no-op Python data sources (an Arrow sink that
drops every batch, a source yielding prepared Arrow batches: what any Python data source pays Spark): the
bare floor, whose module imports nothing but pyspark's data source API (``bare_floor.py``, the strict
baseline), and the floor of the other benchmarks, whose module imports Arrow and NumPy at load
(``spark_common.py``, as a typical Python source does); and parquet. The exchange's fixed cost is its first
write or read minus the bare floor's, measured in the same run in interleaved rounds (best of ``--repeat``).
Session start is not counted (the same for every route). A floor's first write includes registering its
sources: a fresh application's first registration runs Spark's lookup of the installed Python data sources
(a Python worker), which the exchange, installed as ``pyspark_pipelined``, pays at its first use.

Run: .venv/bin/python benchmarks/first_use.py [--repeat 3]
Writes benchmarks/first_use-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUTES = ("bare", "floor", "pipelined", "pipelined-served", "parquet")
ROWS, PARTS = 100_000, 4


def _child(route: str, work: Path) -> dict:
    """One fresh application: the four timed actions of ``route``."""
    sys.path.insert(0, str(HERE))
    from spark_common import NoopArrowSink, PreparedBatches, bench_environment, bench_rows, end_run, prepare_floor_files
    tmp = bench_environment(f"first-use-{route}")
    if route == "pipelined-served":  # the host's service runs already (``serve``, or an earlier application's)
        from sparkflow_exchange.config import ExchangeConfig
        from sparkflow_exchange.service.discovery import resolve

        resolve(ExchangeConfig.load())
    from pyspark.sql import SparkSession

    from sparkflow_exchange.spark.session_tuning import SPARK_SETTINGS

    spark = (SparkSession.builder.master("local[2]").appName(f"first-use-{route}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config(map=SPARK_SETTINGS).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = bench_rows(spark, ROWS, PARTS)
    df.count()  # the session's own first job, the same for every route
    registered = False

    def register(*sources) -> None:
        """A floor's sources registered at its first write: the first registration of a fresh application runs
        Spark's lookup of the installed Python data sources (a Python worker, about a second), which an
        installed source like ours pays at its first use instead."""
        nonlocal registered
        if not registered:
            for source in sources:
                spark.dataSource.register(source)
            registered = True

    if route == "bare":
        from bare_floor import BareSink, BareSource
        prepare_floor_files(ROWS, work / "bare", 1 << 20, PARTS)

        def write() -> None:
            register(BareSink, BareSource)
            df.write.format("bare_sink").mode("append").save()

        def read() -> None:
            (spark.read.format("bare_source").option("dir", str(work / "bare")).option("parts", str(PARTS)).load()
             .write.format("noop").mode("overwrite").save())
    elif route == "floor":
        prepare_floor_files(ROWS, work / "floor", 1 << 20, PARTS)

        def write() -> None:
            register(NoopArrowSink, PreparedBatches)
            df.write.format("floor_sink").mode("append").save()

        def read() -> None:
            (spark.read.format("floor_source").option("dir", str(work / "floor")).option("parts", str(PARTS)).load()
             .write.format("noop").mode("overwrite").save())
    elif route in ("pipelined", "pipelined-served"):
        def write() -> None:
            df.write.format("pipelined").option("exchange", "first-use").option("numSubpartitions", str(PARTS)) \
                .option("partitioner", "hash").option("keys", "key").mode("overwrite").save()

        def read() -> None:
            spark.read.format("pipelined").option("exchange", "first-use").load() \
                .write.format("noop").mode("overwrite").save()
    else:
        def write() -> None:
            df.write.mode("overwrite").parquet(str(work / "parquet"))

        def read() -> None:
            spark.read.parquet(str(work / "parquet")).write.format("noop").mode("overwrite").save()
    times = {}
    for label, action in (("first_write", write), ("second_write", write), ("first_read", read),
                          ("second_read", read)):
        start = time.perf_counter()
        action()
        times[label] = time.perf_counter() - start
    end_run(spark, tmp)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=ROUTES, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args.child, Path(args.work))), flush=True)
        return
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {route: [] for route in ROUTES}
    for round_ in range(args.repeat):
        for route in ROUTES:  # interleaved: a slow spell of the machine falls on every route
            work = Path(tempfile.mkdtemp(prefix="sparkflow-first-use-"))
            try:
                out = subprocess.run([sys.executable, __file__, "--child", route, "--work", str(work)],
                                     capture_output=True, text=True, timeout=900)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{route} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            runs[route].append(json.loads(line[7:]))
            print(f"round {round_ + 1} {route}: " + ", ".join(f"{k} {v:.2f} s" for k, v in runs[route][-1].items()),
                  flush=True)
    best = {route: {k: min(r[k] for r in rs) for k in rs[0]} for route, rs in runs.items()}
    print(f"\nbest of {args.repeat}, seconds (load average before {load_before[0]:.1f}, after "
          f"{os.getloadavg()[0]:.1f}):")
    print(f"{'action':<14}" + "".join(f"{r:>18}" for r in ROUTES) + f"{'pipelined - bare':>20}"
          + f"{'served - bare':>16}")
    for action in best["bare"]:
        print(f"{action:<14}" + "".join(f"{best[r][action]:>18.2f}" for r in ROUTES)
              + f"{best['pipelined'][action] - best['bare'][action]:>+20.2f}"
              + f"{best['pipelined-served'][action] - best['bare'][action]:>+16.2f}")
    result = {"rows": ROWS, "tasks": PARTS, "repeat": args.repeat, "best": best, "runs": runs,
              "load_before": load_before, "load_after": os.getloadavg()}
    (HERE / "first_use-latest.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
