"""What the default compression costs the Python path at Spark's default width, against ``none`` and parquet.

One session (``local[2]``, AQE off, ``spark.sql.shuffle.partitions=200``, ``SPARK_SETTINGS``, no plugin jar: every
``format("pipelined")`` call is the Python data source), ``--rows`` (4 M) of ``spark_common.bench_rows`` in 200
partitions. Routes, each a write and a whole read into Spark's ``noop`` sink:

* ``default``: ``format("pipelined")`` hashed on ``key`` with every other option at its default (no
  ``numSubpartitions``: 200 subpartitions read coalesced; the default ``compression``);
* ``none``: the same with ``compression=none``;
* any of ``--codecs`` beyond those (``lz4``, ``zstd``) written with that codec;
* ``parquet``: write parquet, read, ``repartition(200, key)``.

Untimed ``--warmup`` rounds, then ``--rounds`` rounds in which every route runs once, in reverse order every other
round (this machine drifts within a run), each from a settled start. Reported per route: the median of its rounds'
seconds (the write's and the read's apart), the median of its per-round ratio to ``none``, the exchange's bytes as
the service holds them, and the CPU-seconds of the exchange service and of the Spark driver JVM (``/proc``; the
Python workers are forked per task and not counted). The load average before and after.

``--profile ROUTE``: after the rounds, one more write and read of that route with ``py-spy`` recording the Python
workers and the service (``py-spy`` must be installed in the venv: a measuring tool, not a dependency); the
flame graphs go to ``--profile-dir``.

Run: .venv/bin/python benchmarks/wide_compression.py [--rows 4000000] [--rounds 5] [--warmup 1]
Writes benchmarks/wide_compression-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("wide-compression")  # before Spark starts: its workers and embedded service are this run's

from spark_common import bench_rows, cpu_seconds, end_run, service_pids, settle, wide_session  # noqa: E402

import sparkflow_exchange  # noqa: E402
from sparkflow_exchange.config import ExchangeConfig  # noqa: E402

WIDTH = 200
HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--codecs", default="", help="codecs written besides the default and none, e.g. lz4,zstd")
    parser.add_argument("--profile", default="", help="a route to record once more with py-spy after the rounds")
    parser.add_argument("--profile-dir", default="/tmp/wide-compression-profile")
    parser.add_argument("--out", default=str(HERE / "wide_compression-latest.json"))
    args = parser.parse_args()
    spark = None
    try:
        spark = wide_session("sparkflow-bench-wide-compression", WIDTH)
        results = run(spark, args)
    finally:
        end_run(spark, TMP)
    Path(args.out).write_text(json.dumps(results, indent=2))


def run(spark, args: argparse.Namespace) -> dict:
    df = bench_rows(spark, args.rows, WIDTH)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    parquet_dir = TMP / "parquet"
    runtime = TMP / "runtime"
    default_codec = ExchangeConfig().compression

    def noop(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def exchange_route(name: str, codec: str | None):
        def write() -> None:
            writer = (df.write.format("pipelined").mode("overwrite").option("exchange", name)
                      .option("partitioner", "hash").option("keys", "key"))
            if codec is not None:
                writer = writer.option("compression", codec)
            writer.save()

        def read() -> None:
            noop(spark.read.format("pipelined").option("exchange", name).load())

        return write, read

    def parquet_write() -> None:
        df.write.mode("overwrite").parquet(str(parquet_dir))

    def parquet_read() -> None:
        noop(spark.read.parquet(str(parquet_dir)).repartition(WIDTH, "key"))

    routes = {"default": exchange_route("wc-default", None), "none": exchange_route("wc-none", "none")}
    for codec in (c for c in args.codecs.split(",") if c):
        routes[codec] = exchange_route(f"wc-{codec}", codec)
    routes["parquet"] = (parquet_write, parquet_read)

    def held_bytes(route: str) -> int:
        if route == "parquet":
            return sum(p.stat().st_size for p in parquet_dir.glob("*.parquet"))
        summary = next(s for s in sparkflow_exchange.list_exchanges(spark) if s.name == f"wc-{route}")
        assert summary.rows == args.rows, (route, summary.rows, args.rows)
        return summary.bytes

    for _ in range(args.warmup):
        for write, read in routes.values():
            write()
            read()
    names = list(routes)
    keys = ("write", "read", "total", "service_cpu", "jvm_cpu")
    times = {r: {k: [] for k in keys} for r in names}
    held: dict[str, int] = {}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for route in (names if r % 2 == 0 else names[::-1]):
            write, read = routes[route]
            settle(spark)
            services = service_pids(runtime)
            svc0 = sum(cpu_seconds(p) or 0 for p in services)
            jvm0 = cpu_seconds(jvm_pid)
            start = time.perf_counter()
            write()
            mid = time.perf_counter()
            read()
            end = time.perf_counter()
            t = times[route]
            t["write"].append(mid - start)
            t["read"].append(end - mid)
            t["total"].append(end - start)
            t["service_cpu"].append(sum(cpu_seconds(p) or 0 for p in services) - svc0)
            t["jvm_cpu"].append(cpu_seconds(jvm_pid) - jvm0)
            held[route] = held_bytes(route)
            print(f"round {r} {route:8s} write {mid - start:5.2f} s read {end - mid:5.2f} s total "
                  f"{end - start:5.2f} s  service cpu {t['service_cpu'][-1]:5.2f} s  JVM cpu "
                  f"{t['jvm_cpu'][-1]:5.2f} s  {held[route] / 1e6:7.1f} MB", flush=True)
    load_after = os.getloadavg()

    med = {r: {k: statistics.median(v) for k, v in t.items()} for r, t in times.items()}
    vs_none = {r: statistics.median(a / b for a, b in zip(times[r]["total"], times["none"]["total"])) for r in names}
    print(f"\n{args.rows:,} rows, 200 write tasks hashed on key into {WIDTH} coalesced subpartitions, local[2] on "
          f"{os.cpu_count()} CPUs, default compression {default_codec}, medians of {args.rounds} rounds (routes "
          f"interleaved), load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print("| route | write s | read s | total s | vs none (median of rounds) | MB held | service CPU s | "
          "driver JVM CPU s | rounds (total s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in names:
        m = med[r]
        print(f"| {r} | {m['write']:.2f} | {m['read']:.2f} | {m['total']:.2f} | {vs_none[r]:.2f} | "
              f"{held[r] / 1e6:.1f} | {m['service_cpu']:.2f} | {m['jvm_cpu']:.2f} | "
              f"{' '.join(f'{x:.2f}' for x in times[r]['total'])} |")
    profiles = profile(spark, routes[args.profile], args) if args.profile else None
    return {"rows": args.rows, "rounds": args.rounds, "width": WIDTH, "default_compression": default_codec,
            "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
            "loadavg_before_after": [load_before[0], load_after[0]], "medians": med, "vs_none": vs_none,
            "bytes": held, "all": times, "profiles": profiles}


def profile(spark, route, args: argparse.Namespace) -> dict:
    """One more write and read of ``route`` with py-spy recording every Python process of this user (the
    Python workers are forked per task: ``--subprocesses`` on the PySpark daemon) and the service."""
    pyspy = Path(sys.executable).parent / "py-spy"
    if not pyspy.exists():
        raise SystemExit(f"{pyspy} not found: pip install py-spy into the venv to profile")
    out = Path(args.profile_dir)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    daemons = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd(p).find("pyspark.daemon") >= 0
               and _cmd(p).find("python") >= 0]
    targets = {f"daemon-{pid}": pid for pid in daemons}
    targets.update({f"service-{pid}": pid for pid in service_pids(TMP / "runtime")})
    recorders = []
    for label, pid in targets.items():
        recorders.append(subprocess.Popen(
            [str(pyspy), "record", "--pid", str(pid), "--subprocesses", "--rate", "200", "--format", "raw",
             "--output", str(out / f"{label}.txt"), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)
    write, read = route
    write()
    read()
    time.sleep(0.5)
    for recorder in recorders:
        recorder.send_signal(2)
    for recorder in recorders:
        recorder.wait(timeout=60)
    print(f"profiles in {out}: {sorted(p.name for p in out.iterdir())}")
    return {"dir": str(out), "targets": targets}


def _cmd(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


if __name__ == "__main__":
    main()
