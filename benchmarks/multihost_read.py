"""Cross-host reads against the link: the Python reader and the jar's reader in a Spark application, per codec.

Three hosts built as ``tests/multihost.py`` builds them (network namespaces on one bridge, 198.18.0.0/24, each host
with its own host name, ``/tmp`` and ``/dev/shm``): the coordinator on host0, ``serve --no-coordinator`` on host1
and host2, configured by the hosts' ``spark-defaults.conf`` with TLS off (a plain socket copy is the reference; no
Spark standalone: each application runs ``local[2]`` on its host). On host1 ``open_writer`` writes the first
``--rows`` rows of TPC-H ``lineitem`` (``tpch_pipeline.py``'s ``tpchgen-cli`` data, all 16 columns) hashed on
``l_orderkey`` into 8 subpartitions, once per codec; host1's service holds them. On host2, in one process per
reader and link state, rounds alternate the routes (reversed every other round), medians of ``--rounds``:

* ``socket``: a plain TCP copy of as many bytes as the uncompressed exchange holds, from a process on host1 that
  sends them from memory (``sendall``) into ``recv_into`` on host2: what the two hosts' stacks move.
* ``python/<codec>``: ``open_reader`` of the whole exchange, every batch received and decoded (the
  rows' Arrow bytes counted).
* ``spark/<codec>``: a Spark application on host2 (the jar's reader through its catalog,
  ``spark.table("exchange.<name>")`` into the ``noop`` sink: every column decoded); its session start and one
  warm-up read are not timed;
* ``spark/parquet`` and ``spark/cached`` (the bound for any reader that hands Spark rows): the same application reads
  the same rows from a parquet file on host2's own disk (written once, snappy, untimed), and from a cached
  DataFrame of them, into ``noop``: what Spark spends on these rows with no network at all.

Link states: ``unshaped`` (veth pairs on a bridge: the 2 cores are the limit) and ``shaped``: ``tc`` on host2's
``eth0``, a token bucket (``tbf rate 1gbit burst 256kb latency 5ms``) on what leaves it and, through an ``ifb``
device its ingress is redirected to, on what it receives. Reported per route: seconds, wire MB/s (the bytes the
exchange holds, what crosses the link), raw MB/s (the rows' Arrow bytes), their ratios to the link's rate
(125 MB/s), and the socket copy's time over the route's: the socket copy moves the uncompressed exchange's bytes, so
this is the rows' rate against the plain copy's.

Needs root, ``ip``, ``tc``, ``unshare``, ``nsenter``, ``openssl``, Java, the plugin jar.
Run: .venv/bin/python benchmarks/multihost_read.py [--rows 3000000] [--rounds 3] [--codecs none,lz4,zstd]
Writes benchmarks/multihost_read-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
SOCKET_PORT = 7390
SERVICE_PORT = 7338  # tests/multihost.py's: every host's service
LINK_MBPS = 125.0  # 1 Gbit/s in MB/s (10^6 bytes)
SHAPE = ("tbf", "rate", "1gbit", "burst", "256kb", "latency", "5ms")


# ---------------------------------------------------------------- the parts run inside a host
def serve_bytes(size: int) -> None:
    """host1: send ``size`` bytes from memory to every connection, until killed."""
    payload = memoryview(os.urandom(1 << 20) * ((size >> 20) + 1))[:size]
    with socket.create_server(("0.0.0.0", SOCKET_PORT), reuse_port=True) as server:
        print("ready", flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(payload)


def _copy(host: str, size: int) -> float:
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    got = 0
    started = time.perf_counter()
    with socket.create_connection((host, SOCKET_PORT)) as conn:
        while True:
            n = conn.recv_into(view)
            if n == 0:
                break
            got += n
    took = time.perf_counter() - started
    assert got == size, (got, size)
    return took


def write(rows: int, codecs: list[str], data: str) -> None:
    """host1: the exchanges, one per codec, by open_writer; their rows and Arrow bytes as JSON."""
    from tpch_pipeline import lineitem_batches

    import sparkflow_exchange as sfe

    batches = lineitem_batches(data, rows)
    n = sum(b.num_rows for b in batches)
    raw = sum(b.nbytes for b in batches)
    out = {"rows": n, "raw_bytes": raw, "write_s": {}}
    for codec in codecs:
        started = time.perf_counter()
        with sfe.open_writer(f"mh_{codec}", batches[0].schema, keys=["l_orderkey"], num_subpartitions=8,
                             compression=codec) as w:
            for b in batches:
                w.write(b)
        out["write_s"][codec] = time.perf_counter() - started
    out["held"] = {s.name: s.bytes for s in sfe.list_exchanges() if s.name.startswith("mh_")}
    print(json.dumps(out), flush=True)


def python_reads(source: str, size: int, codecs: list[str], rounds: int) -> None:
    """host2: rounds of the socket copy and open_reader of every codec's exchange, alternating; JSON."""
    import sparkflow_exchange as sfe

    routes = ["socket", *codecs]
    times: dict[str, list[float]] = {r: [] for r in routes}
    raw: dict[str, int] = {}
    connects = []  # TCP handshakes with host1's service: the link's round trip (no ping in the hosts)
    for _ in range(5):
        started = time.perf_counter()
        socket.create_connection((source, SERVICE_PORT)).close()
        connects.append(time.perf_counter() - started)
    with sfe.open_reader(f"mh_{codecs[-1]}") as reader:  # warm-up: the first read connects and authenticates
        for _batch in reader:
            pass
    for r in range(rounds):
        for route in (routes if r % 2 == 0 else routes[::-1]):
            if route == "socket":
                times[route].append(_copy(source, size))
                continue
            started = time.perf_counter()
            total = 0
            with sfe.open_reader(f"mh_{route}") as reader:
                for batch in reader:
                    total += batch.nbytes
            times[route].append(time.perf_counter() - started)
            raw[route] = total
    print(json.dumps({"times": times, "raw": raw, "connect_ms": statistics.median(connects) * 1e3}), flush=True)


def spark_reads(codecs: list[str], rounds: int, data: str, rows: int) -> None:
    """host2: a Spark application reading every codec's exchange through the jar, and the same rows from a local
    parquet file and from a cached DataFrame (the bounds), alternating; JSON."""
    import tempfile

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("multihost-read")
             .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    local = str(Path(tempfile.mkdtemp(prefix="multihost-read-")) / "lineitem.parquet")
    spark.read.parquet(data).limit(rows).coalesce(2).write.parquet(local)  # host2's own disk, untimed
    cached = spark.read.parquet(local).cache()
    cached.count()
    sources = {**{c: (lambda c=c: spark.table(f"exchange.mh_{c}")) for c in codecs},
               "parquet": lambda: spark.read.parquet(local), "cached": lambda: cached}
    for source in sources.values():  # warm-up: each plan's code compiled once
        source().write.format("noop").mode("overwrite").save()
    names = list(sources)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            sources[name]().write.format("noop").mode("overwrite").save()
            times[name].append(time.perf_counter() - started)
    spark.stop()
    print(json.dumps({"times": times}), flush=True)


# ---------------------------------------------------------------- the driver (outside the hosts)
def _json(proc: subprocess.CompletedProcess, what: str) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def _shape(cluster, host, on: bool) -> None:
    ns = host.netns

    def tc(*args: str, check: bool = True) -> None:
        proc = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise RuntimeError(f"tc {' '.join(args)}: {proc.stderr.strip()}")

    if not on:
        tc("qdisc", "del", "dev", "eth0", "root", check=False)
        tc("qdisc", "del", "dev", "eth0", "ingress", check=False)
        subprocess.run(["ip", "-n", ns, "link", "del", "ifb0"], capture_output=True, timeout=30)
        return
    subprocess.run(["ip", "-n", ns, "link", "add", "ifb0", "type", "ifb"], check=True, timeout=30)
    subprocess.run(["ip", "-n", ns, "link", "set", "ifb0", "up"], check=True, timeout=30)
    tc("qdisc", "add", "dev", "eth0", "root", *SHAPE)
    tc("qdisc", "add", "dev", "eth0", "handle", "ffff:", "ingress")
    tc("filter", "add", "dev", "eth0", "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0", "0",
       "action", "mirred", "egress", "redirect", "dev", "ifb0")
    tc("qdisc", "add", "dev", "ifb0", "root", *SHAPE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codecs", default="none,lz4,zstd")
    parser.add_argument("--sf", type=float, default=5, help="the TPC-H data's scale factor (lineitem's rows)")
    parser.add_argument("--part", nargs="*", help=argparse.SUPPRESS)  # the parts run inside hosts
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    if args.part:
        kind, *rest = args.part
        if kind == "serve-bytes":
            serve_bytes(int(rest[0]))
        elif kind == "write":
            write(args.rows, codecs, rest[0])
        elif kind == "python":
            python_reads(rest[0], int(rest[1]), codecs, args.rounds)
        elif kind == "spark":
            spark_reads(codecs, args.rounds, rest[0], args.rows)
        return
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(HERE))
    import multihost
    import tpch_pipeline

    why = multihost.unavailable()
    if why:
        sys.exit(f"cannot build hosts: {why}")
    data = tpch_pipeline.ensure_data(args.sf) / "lineitem.parquet"

    class Hosts(multihost.Cluster):
        """The test cluster without Spark standalone (applications run local[2]) and without TLS."""

        def _spark(self) -> None:
            pass

        def spark_defaults(self, host) -> str:
            lines = [line for line in super().spark_defaults(host).splitlines()
                     if ".tls." not in line and not line.startswith(("spark.master", "spark.cores.max",
                                                                         "spark.scheduler.minRegistered"))]
            return "\n".join([*lines, "spark.master local[2]", "spark.ui.showConsoleProgress false"]) + "\n"

    me = [multihost.PYTHON, str(Path(__file__).resolve()), "--rows", str(args.rows), "--rounds", str(args.rounds),
          "--codecs", args.codecs]
    out: dict = {"rows": args.rows, "rounds": args.rounds, "codecs": codecs, "link_mb_s": LINK_MBPS, "states": {}}
    with Hosts(hosts=3) as cluster:
        h1, h2 = cluster.hosts[1], cluster.hosts[2]
        wrote = _json(h1.run([*me, "--part", "write", str(data)], timeout=1800), "the write on host1")
        out.update(written=wrote)
        size = wrote["held"]["mh_none"]
        print(f"wrote {wrote['rows']:,} rows: {wrote}", flush=True)
        h1.start("bytes", [*me, "--part", "serve-bytes", str(size)])
        multihost.wait_for("the socket copy's sender", lambda: "ready" in (h1.dir / "bytes.out").read_text())
        for state in ("unshaped", "shaped"):
            _shape(cluster, h2, state == "shaped")
            py = _json(h2.run([*me, "--part", "python", h1.ip, str(size)], timeout=3600), f"python reads ({state})")
            sp = _json(h2.run([*me, "--part", "spark", str(data)], timeout=3600, spark=True),
                       f"spark reads ({state})")
            out["states"][state] = {"python": py, "spark": sp}
            print(state, json.dumps(out["states"][state]), flush=True)
            (HERE / "multihost_read-latest.json").write_text(json.dumps(out, indent=1))
        _shape(cluster, h2, False)
    report(out)


def report(out: dict) -> None:
    held, raw_rows = out["written"]["held"], out["written"]["raw_bytes"]
    print(f"\n{out['written']['rows']:,} lineitem rows, {raw_rows / 1e6:,.0f} MB of Arrow; medians of {out['rounds']}")
    print("| link | route | s | wire MB/s | raw MB/s | wire / link | raw / link | vs socket copy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for state, got in out["states"].items():
        print(f"| {state} | TCP handshake with host1 {got['python']['connect_ms']:.2f} ms | | | | | | |")
        sock = statistics.median(got["python"]["times"]["socket"])
        size = held["mh_none"]
        rows = [("socket copy", sock, size, size)]
        for codec in out["codecs"]:
            wire = held[f"mh_{codec}"]
            rows.append((f"python {codec}", statistics.median(got["python"]["times"][codec]), wire, raw_rows))
            rows.append((f"spark {codec}", statistics.median(got["spark"]["times"][codec]), wire, raw_rows))
        for bound in ("parquet", "cached"):  # no network: what Spark spends on the rows
            if bound in got["spark"]["times"]:
                rows.append((f"spark {bound} (local)", statistics.median(got["spark"]["times"][bound]), 0, raw_rows))
        for name, s, wire, raw in rows:
            wire_cells = f"{wire / s / 1e6:,.0f} | {raw / s / 1e6:,.0f} | {wire / s / 1e6 / LINK_MBPS:.2f}" if wire \
                else f" | {raw / s / 1e6:,.0f} | "
            print(f"| {state} | {name} | {s:.2f} | {wire_cells} | {raw / s / 1e6 / LINK_MBPS:.2f} | {sock / s:.2f} |")


if __name__ == "__main__":
    main()
