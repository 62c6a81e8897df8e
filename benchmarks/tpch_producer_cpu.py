"""A TPC-H producer's write into the exchange against parquet's: wall time and the CPU-seconds each process used.

On a machine shared with other work, wall time says more about the neighbours than about the write; the
CPU-seconds a route's processes use do not depend on them as much. Each run is one fresh producer application of
``tpch_pipeline.py`` (its ``--child produce``: the query's producer half, ``local[2]``, written hashed on the query's
key into ``--shuffle-partitions`` subpartitions), with a fresh runtime directory:

* ``jvm``: through the JVM catalog (``writeTo("exchange.<name>")``), into the embedded service the producer starts;
* ``format``: ``df.write.format("pipelined")`` served by the jar;
* ``parquet``: the same rows written as parquet;
* ``noop``: Spark's ``noop`` sink, the floor.

Reported per run: the application's wall time and its work (``work_s``: after the session is up), the CPU-seconds
of the driver JVM (every thread: tasks, GC, JIT), of the producer's Python process and of the exchange service
(read from ``/proc`` until each exits), the driver JVM's by kind of thread (the JIT's compiler threads, Spark's
task threads, the garbage collector's, the rest: ``/proc/<pid>/task``), and the load average. Routes alternate
within a round; medians of ``--repeat`` rounds.

Run: .venv/bin/python benchmarks/tpch_producer_cpu.py --sf 5 --query 18 [--routes jvm,parquet] [--repeat 3]
     [--data benchmarks/.tpch]
Writes benchmarks/tpch_producer_cpu-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUTES = ("jvm", "format", "parquet", "noop")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def process_name(pid: int, app: int, service: int | None) -> str:
    """What ``pid`` is to the run: the exchange service, the application's Python process, its driver JVM, or
    another of its processes (a Python worker)."""
    if pid == service:
        return "service"
    if pid == app:
        return "python"
    try:
        return "jvm" if Path(f"/proc/{pid}/comm").read_text().strip() == "java" else "other"
    except OSError:
        return "other"


THREAD_KINDS = (("jit", ("C1 CompilerThre", "C2 CompilerThre")), ("tasks", ("Executor task",)),
                ("gc", ("GC Thread", "G1 ", "VM Thread")))


def thread_kind(comm: str) -> str:
    """A JVM thread's kind by its name: the JIT's compiler threads, Spark's task threads, the collector's, other."""
    return next((kind for kind, prefixes in THREAD_KINDS if comm.startswith(prefixes)), "other")


def jvm_threads(pid: int, into: dict[int, tuple[str, float]]) -> None:
    """Each thread of JVM ``pid``: its kind and CPU-seconds so far (``/proc/<pid>/task``), kept by thread id (a
    thread that ends keeps its last reading)."""
    from spark_common import stat_cpu_seconds  # benchmarks/ is this script's own directory

    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        into[int(tid)] = (thread_kind(stat[stat.index("(") + 1:stat.rindex(")")]), stat_cpu_seconds(stat))


def run(route: str, sf: float, query: int, data: Path, partitions: int) -> dict:
    """One fresh producer application of ``route``; its times and its processes' CPU-seconds."""
    from spark_common import cpu_seconds  # benchmarks/ is this script's own directory

    tmp = Path(tempfile.mkdtemp(prefix=f"sparkflow-producer-cpu-{route}-"))
    env = dict(os.environ, SPARKFLOW_EXCHANGE_RUNTIME_DIR=str(tmp / "runtime"), PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, str(HERE / "tpch_pipeline.py"), "--child", "produce", "--io", route, "--query",
           str(query), "--data", str(data / f"sf{sf:g}"), "--exchange", f"q{query}", "--path", str(tmp / "out"),
           "--shuffle-partitions", str(partitions)]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with open(tmp / "out.log", "w") as out, open(tmp / "err.log", "w") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=out, stderr=err)
    seen: dict[int, tuple[str, float]] = {}  # pid -> (name, last CPU-seconds read)
    threads: dict[int, tuple[str, float]] = {}  # the driver JVM's threads: tid -> (kind, last CPU-seconds read)
    service = None
    while proc.poll() is None:
        tree, i = [proc.pid], 0
        while i < len(tree):
            tree += children(tree[i])
            i += 1
        if service is None and (tmp / "runtime" / "embedded.json").exists():
            try:
                service = json.loads((tmp / "runtime" / "embedded.json").read_text())["pid"]
            except (ValueError, KeyError, OSError):
                pass
        for pid in {*tree, *([service] if service else [])}:
            used = cpu_seconds(pid)
            if used is not None:
                seen[pid] = (process_name(pid, proc.pid, service), used)
                if seen[pid][0] == "jvm":
                    jvm_threads(pid, threads)
        time.sleep(0.2)
    wall = time.perf_counter() - started
    if service is not None:
        used = cpu_seconds(service)
        if used is not None:
            seen[service] = ("service", used)
    text = (tmp / "out.log").read_text()
    line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"{route} failed (exit {proc.returncode}):\n{(tmp / 'err.log').read_text()[-4000:]}")
    result = json.loads(line[7:])
    cpu: dict[str, float] = {}
    for name, used in seen.values():
        cpu[name] = round(cpu.get(name, 0.0) + used, 2)
    jvm_by_kind: dict[str, float] = {}
    for kind, used in threads.values():
        jvm_by_kind[kind] = round(jvm_by_kind.get(kind, 0.0) + used, 2)
    if service is not None:
        from sparkflow_exchange.service.process import stop_embedded

        stop_embedded(tmp / "runtime")
    shutil.rmtree(tmp, ignore_errors=True)
    return {"wall_s": round(wall, 2), "session_s": round(result["session_s"], 2), "work_s": round(result["work_s"], 2),
            "cpu_s": cpu, "cpu_total_s": round(sum(cpu.values()), 2), "jvm_threads_cpu_s": jvm_by_kind,
            "load": round(load, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--query", type=int, default=18)
    parser.add_argument("--routes", default="jvm,parquet")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shuffle-partitions", type=int, default=200)
    parser.add_argument("--data", type=Path, default=HERE / ".tpch", help="holds sf<N>/<table>.parquet")
    args = parser.parse_args()
    routes = [r for r in args.routes.split(",") if r]
    unknown = [r for r in routes if r not in ROUTES]
    if unknown:
        sys.exit(f"unknown route(s) {unknown}: use {', '.join(ROUTES)}")
    if not (args.data / f"sf{args.sf:g}" / "lineitem.parquet").exists():
        sys.exit(f"no TPC-H data at {args.data / f'sf{args.sf:g}'}: run tpch_pipeline.py --sf {args.sf:g} once")
    runs: dict[str, list[dict]] = {r: [] for r in routes}
    for round_ in range(args.repeat):
        for route in routes:
            r = run(route, args.sf, args.query, args.data, args.shuffle_partitions)
            runs[route].append(r)
            print(f"round {round_ + 1} {route}: wall {r['wall_s']} s, work {r['work_s']} s, CPU {r['cpu_total_s']} s "
                  f"{r['cpu_s']}, JVM threads {r['jvm_threads_cpu_s']} (load {r['load']})", flush=True)
    print(f"\nmedians of {args.repeat}, Q{args.query} producer at scale factor {args.sf:g}:")
    print(f"{'route':<9}{'wall':>8}{'work':>8}{'CPU':>8}{'JVM CPU':>9}{'service CPU':>13}"
          f"{'JVM: JIT':>10}{'tasks':>7}{'GC':>6}{'other':>7}")
    summary = {}
    for route, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "work_s", "cpu_total_s")}
        med["jvm_cpu_s"] = statistics.median(r["cpu_s"].get("jvm", 0.0) for r in rs)
        med["service_cpu_s"] = statistics.median(r["cpu_s"].get("service", 0.0) for r in rs)
        for kind in ("jit", "tasks", "gc", "other"):
            med[f"jvm_{kind}_cpu_s"] = statistics.median(r["jvm_threads_cpu_s"].get(kind, 0.0) for r in rs)
        summary[route] = med
        print(f"{route:<9}{med['wall_s']:>8.1f}{med['work_s']:>8.1f}{med['cpu_total_s']:>8.1f}{med['jvm_cpu_s']:>9.1f}"
              f"{med['service_cpu_s']:>13.2f}{med['jvm_jit_cpu_s']:>10.1f}{med['jvm_tasks_cpu_s']:>7.1f}"
              f"{med['jvm_gc_cpu_s']:>6.1f}{med['jvm_other_cpu_s']:>7.1f}")
    (HERE / "tpch_producer_cpu-latest.json").write_text(json.dumps(
        {"sf": args.sf, "query": args.query, "repeat": args.repeat, "median": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
