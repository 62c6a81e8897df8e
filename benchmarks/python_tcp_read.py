"""A read over TCP on one host: ``open_reader`` on a "remote" host id against a plain socket copy, with CPU.

One service on 127.0.0.1 (``tests/harness.py``'s ``start_service``) holds one exchange per codec: the first
``--rows`` rows of TPC-H ``lineitem`` (``tpch_pipeline.py``'s data, all 16 columns), written by ``open_writer`` hashed
on ``l_orderkey`` into 8 subpartitions. Each read runs in a process of its own whose ``hostId`` differs from the
service's, so every buffer comes over TCP (no shared memory, no spill file). Routes alternate within each round
(reversed every other round); per route: the median read's seconds, the socket copy's time over it, and the median
CPU of the reading process and of the service (user + system) per read. A plain TCP copy of as many bytes as the
uncompressed exchange holds, from another process's memory (``sendall`` into ``recv_into``), is the reference.

``--baseline DIR``: also read with the ``sparkflow_exchange`` package in DIR (e.g. ``git archive main
sparkflow_exchange | tar -x -C DIR``), alternating with this tree's, to compare two trees in one run: the
baseline's routes read from a second service running DIR's package, which holds the same exchanges (written by
this tree's writer), so both the reader and the service are the baseline's. Reports the load average: on a shared
machine, compare only routes of one run.

Run: .venv/bin/python benchmarks/python_tcp_read.py [--rows 3000000] [--rounds 3] [--reads 2] [--codecs none,zstd]
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

READER = r"""
import json, os, resource, sys, time
import sparkflow_exchange as sfe
name, n, common, svc_pid = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
def svc_cpu():
    with open(f"/proc/{svc_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
def read():
    rows = raw = 0
    r0, s0, t0 = resource.getrusage(resource.RUSAGE_SELF), svc_cpu(), time.perf_counter()
    with sfe.open_reader(name, hostId="elsewhere", **common) as reader:
        for batch in reader:
            rows += batch.num_rows
            raw += batch.nbytes
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return [time.perf_counter() - t0, cpu, svc_cpu() - s0, rows, raw]
read()  # connects and authenticates
print(json.dumps([read() for _ in range(n)]))
"""

SENDER = r"""
import os, socket, sys
size = int(sys.argv[1])
payload = memoryview(os.urandom(1 << 20) * ((size >> 20) + 1))[:size]
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(payload)
"""


def _copy(port: int, size: int) -> list[float]:
    view = memoryview(bytearray(4 << 20))
    got = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        while n := conn.recv_into(view):
            got += n
    assert got == size, (got, size)
    return [time.perf_counter() - t0, time.process_time() - c0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=2, help="reads per route and round (one process)")
    parser.add_argument("--codecs", default="none,zstd")
    parser.add_argument("--sf", type=float, default=1, help="the TPC-H data's scale factor")
    parser.add_argument("--baseline", help="a directory holding another sparkflow_exchange package to compare")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests"), str(HERE)]
    import tpch_pipeline
    from harness import start_service

    import sparkflow_exchange as sfe

    codecs = args.codecs.split(",")
    # a neutral working directory: a reader's `python -c` and a service's `-m` would import the package in the
    # current directory (sys.path[0]) before PYTHONPATH's, whichever tree they were meant to run
    os.chdir(tempfile.mkdtemp(prefix="sparkflow-loopback-cwd-"))
    trees = {"this": str(ROOT)} | ({"baseline": str(Path(args.baseline).resolve())} if args.baseline else {})
    services = {}
    for tree, path in trees.items():  # each tree's reader reads from a service of its own package
        svc = start_service(Path(tempfile.mkdtemp(prefix="sparkflow-loopback-")), host_id="service-host",
                            env={"PYTHONPATH": path})
        atexit.register(svc.proc.terminate)
        services[tree] = svc
    batches = tpch_pipeline.lineitem_batches(tpch_pipeline.ensure_data(args.sf) / "lineitem.parquet", args.rows)
    schema = batches[0].schema
    n = sum(b.num_rows for b in batches)
    for svc in services.values():
        common = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
        for codec in codecs:
            with sfe.open_writer(f"loopback_{codec}", schema, keys=["l_orderkey"], num_subpartitions=8,
                                 compression=codec, hostId="service-host", **common) as w:
                for b in batches:
                    w.write(b)
    svc = services["this"]
    common = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
    held = {s.name: s.bytes for s in sfe.list_exchanges(**common) if s.name.startswith("loopback_")}
    size = held["loopback_none"] if "loopback_none" in held else sum(b.nbytes for b in batches)
    sender = subprocess.Popen([sys.executable, "-c", SENDER, str(size)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    atexit.register(sender.kill)
    port = int(sender.stdout.readline())
    routes = ["socket"] + [f"{tree}/{codec}" for codec in codecs for tree in trees]
    got: dict[str, list[list[float]]] = {r: [] for r in routes}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for route in (routes if r % 2 == 0 else routes[::-1]):
            if route == "socket":
                got[route] += [_copy(port, size) for _ in range(args.reads)]
                continue
            tree, codec = route.split("/")
            svc = services[tree]
            common = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
            out = subprocess.run([sys.executable, "-c", READER, f"loopback_{codec}", str(args.reads), json.dumps(common),
                                  str(svc.proc.pid)], env={**os.environ, "PYTHONPATH": trees[tree]},
                                 capture_output=True, text=True, timeout=900)
            if out.returncode:
                sys.exit(f"{route}: {out.stderr[-2000:]}")
            got[route] += json.loads(out.stdout.strip().splitlines()[-1])
    med = {r: statistics.median(x[0] for x in v) for r, v in got.items()}
    print(f"{n} rows, held {held}, load average {min(loads):.1f}-{max(loads):.1f}, {args.rounds} rounds x {args.reads} reads")
    for route, v in got.items():
        line = (f"{route:16s} {med[route]:6.3f} s {size / med[route] / 1e6:6.0f} MB/s  vs socket copy "
                f"{med['socket'] / med[route]:.2f}  cpu {statistics.median(x[1] for x in v):.2f} s")
        if route != "socket":
            line += f"  service cpu {statistics.median(x[2] for x in v):.2f} s  rows {v[0][3]}"
        print(line)
    (HERE / "python_tcp_read-latest.json").write_text(json.dumps({"held": held, "loads": loads, "runs": got}, indent=1))


if __name__ == "__main__":
    main()
