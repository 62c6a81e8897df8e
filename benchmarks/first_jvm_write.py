"""A fresh application's first JVM write against Spark's ``noop`` sink's: the fixed cost a short job pays.

Each case is a fresh Python process with a fresh SparkSession (``local[2]``, built with
``sparkflow_exchange.configure``, so every route has the plugin jar on ``spark.jars``) and a fresh runtime
directory. After the session's own first job (a ``count`` of the rows), it times the first write of 100,000 rows
(``bench_rows``, 2 tasks), then a second write of the same rows (warm):

* ``noop``: ``df.write.format("noop")``, the floor: Spark's own work for the job, nothing written;
* ``jvm``: ``df.write.format("pipelined")`` hashed on ``key`` into 200 subpartitions, served by the jar's JVM writer;
  no service runs on the host when the application starts, as for a user's first application on a host
  (``configure``'s warm-up extension starts the embedded service when the session starts);
* ``jvm-served``: the same with the host's service up before the application starts (``sparkflow-exchange serve``,
  or an earlier application's embedded service still up);
* ``jvm-no-warmup``: ``jvm`` without the jar's warm-up extension (``spark.sql.extensions`` left out of what
  ``configure`` sets): the first write loads the writer's classes and starts the embedded service itself, as
  before the warm-up.

Also reported: the session's start and first job (``session``), which the warm-up runs beside.

Routes alternate within each round, so a slow spell of the shared machine falls on every route. Reported: the
median of ``--repeat`` fresh applications per route, and each route's first write minus ``noop``'s of the same
round (median of those differences).

Run: .venv/bin/python benchmarks/first_jvm_write.py [--repeat 5]
Writes benchmarks/first_jvm_write-latest.json.
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
ROUTES = ("noop", "jvm", "jvm-served", "jvm-no-warmup")
ROWS, PARTS, SUBPARTITIONS = 100_000, 2, 200


def _child(route: str) -> dict:
    """One fresh application: the first and second write of ``route``."""
    sys.path.insert(0, str(HERE))
    from spark_common import bench_environment, bench_rows, end_run
    tmp = bench_environment(f"first-jvm-write-{route}")
    if route == "jvm-served":
        from sparkflow_exchange.config import ExchangeConfig
        from sparkflow_exchange.service.discovery import resolve

        resolve(ExchangeConfig.load())
    from pyspark.sql import SparkSession

    import sparkflow_exchange

    started = time.perf_counter()
    builder = sparkflow_exchange.configure(
        SparkSession.builder.master("local[2]").appName(f"first-jvm-write-{route}")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    if route == "jvm-no-warmup":
        builder._options.pop("spark.sql.extensions")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    df = bench_rows(spark, ROWS, PARTS)
    df.count()  # the session's own first job, the same for every route
    times = {"session": time.perf_counter() - started}

    def write() -> None:
        if route == "noop":
            df.write.format("noop").mode("overwrite").save()
        else:
            df.write.format("pipelined").option("exchange", "first-jvm-write").option("keys", "key") \
                .option("numSubpartitions", str(SUBPARTITIONS)).mode("overwrite").save()

    for label in ("first_write", "second_write"):
        start = time.perf_counter()
        write()
        times[label] = time.perf_counter() - start
    if route != "noop":  # the JVM path served it: the read's scan is the exchange's own
        plan = spark.read.format("pipelined").option("exchange", "first-jvm-write").load() \
            ._jdf.queryExecution().executedPlan().toString()
        assert "sparkflow-exchange first-jvm-write" in plan, plan
    end_run(spark, tmp)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--child", choices=ROUTES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args.child)), flush=True)
        return
    routes = [r for r in args.routes.split(",") if r]
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {route: [] for route in routes}
    for round_ in range(args.repeat):
        for route in routes:  # alternating: a slow spell of the machine falls on every route
            out = subprocess.run([sys.executable, __file__, "--child", route], capture_output=True, text=True,
                                 timeout=900)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{route} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
            runs[route].append(json.loads(line[7:]))
            print(f"round {round_ + 1} {route}: " + ", ".join(f"{k} {v:.2f} s" for k, v in runs[route][-1].items())
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    median = {route: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for route, rs in runs.items()}
    over_noop = {route: statistics.median(r["first_write"] - n["first_write"] for r, n in zip(rs, runs["noop"]))
                 for route, rs in runs.items() if route != "noop" and "noop" in runs}
    print(f"\nmedian of {args.repeat} fresh applications, seconds (load average before {load_before[0]:.1f}, "
          f"after {os.getloadavg()[0]:.1f}):")
    print(f"{'route':<15}{'session':>9}{'first write':>13}{'second write':>14}{'first - noop':>14}")
    for route in routes:
        extra = f"{over_noop[route]:>+14.2f}" if route in over_noop else f"{'':>14}"
        print(f"{route:<15}{median[route]['session']:>9.2f}{median[route]['first_write']:>13.2f}"
              f"{median[route]['second_write']:>14.2f}{extra}")
    result = {"rows": ROWS, "tasks": PARTS, "subpartitions": SUBPARTITIONS, "repeat": args.repeat,
              "median": median, "first_write_over_noop": over_noop, "runs": runs,
              "load_before": load_before, "load_after": os.getloadavg()}
    (HERE / "first_jvm_write-latest.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
