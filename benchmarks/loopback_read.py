"""The jar's reader over TCP on one host: where a Spark read of a remote producer spends its time.

One host, one exchange service (this run's own, embedded), one Spark application (``local[2]``) with two catalogs on
the same exchange: ``exchange`` reads the producers' spill files (this host's), ``faraway`` believes it runs on
another host (``hostId``) and reads every producer from the service over loopback TCP under credit. The exchange is
``--rows`` rows of TPC-H ``lineitem`` (all 16 columns) written by ``open_writer`` hashed on ``l_orderkey`` into 8
subpartitions (``--codec``). Routes, alternating within each round, medians of ``--rounds``:

* ``socket``: a plain loopback TCP copy of as many bytes as the exchange holds (``sendall`` into ``recv_into``);
* ``noop tcp`` / ``noop file``: ``spark.table(..)`` into the ``noop`` sink (every column turned into rows);
* ``count tcp`` / ``count file``: ``count()`` (every buffer received, checked and decoded; no rows made).

Per route: seconds, the exchange's MB/s, the socket copy's time over the route's, and the CPU seconds the Spark
JVM and the exchange service spent (``/proc``), which stay comparable on a loaded machine where times do not.
``--jfr PATH`` records the JVM with Java Flight Recorder (``jfr print --events jdk.ExecutionSample PATH``).

Run: .venv/bin/python benchmarks/loopback_read.py [--rows 3000000] [--rounds 5] [--codec none]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--sf", type=float, default=5, help="the TPC-H data's scale factor (lineitem's rows)")
    parser.add_argument("--jfr", help="record the Spark JVM with JFR into this file")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loopback-read-"))
    os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = str(tmp / "runtime")
    sys.path.insert(0, str(HERE))
    import tpch_pipeline

    import sparkflow_exchange as sfe
    from sparkflow_exchange.service.process import stop_embedded

    batches = tpch_pipeline.lineitem_batches(tpch_pipeline.ensure_data(args.sf) / "lineitem.parquet", args.rows)
    schema = batches[0].schema
    try:
        with sfe.open_writer("loopback", schema, keys=["l_orderkey"], num_subpartitions=8,
                             compression=args.codec) as w:
            for b in batches:
                w.write(b)
        size = next(s.bytes for s in sfe.list_exchanges() if s.name == "loopback")
        run(args, size, _service_pid(tmp))
    finally:
        stop_embedded(tmp / "runtime")


def _service_pid(tmp: Path) -> int:
    """The pid of this run's embedded exchange service."""
    return json.loads((tmp / "runtime" / "embedded.json").read_text())["pid"]


def run(args: argparse.Namespace, size: int, service: int) -> None:
    """The routes, alternating, and their table."""
    from pyspark.sql import SparkSession
    from spark_common import cpu_seconds  # on sys.path since main()

    import sparkflow_exchange as sfe

    payload = memoryview(os.urandom(1 << 20) * ((size >> 20) + 1))[:size]
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(payload)

    threading.Thread(target=serve, daemon=True).start()

    def copy() -> None:
        buf = memoryview(bytearray(4 << 20))
        got = 0
        with socket.create_connection(server.getsockname()) as conn:
            while k := conn.recv_into(buf):
                got += k
        assert got == size, (got, size)

    builder = (SparkSession.builder.master("local[2]").appName("loopback-read")
               .config("spark.jars", str(sfe.plugin_jar())).config("spark.ui.enabled", "false")
               .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
               .config("spark.sql.catalog.faraway", "org.sparkflow.exchange.catalog.ExchangeCatalog")
               .config("spark.sql.catalog.faraway.hostId", "another-host"))
    if args.jfr:
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-XX:StartFlightRecording=filename={args.jfr},settings=profile")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = int(subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True,
                             text=True).stdout.split()[0])
    routes = {
        "socket": copy,
        "noop tcp": lambda: spark.table("faraway.loopback").write.format("noop").mode("overwrite").save(),
        "noop file": lambda: spark.table("exchange.loopback").write.format("noop").mode("overwrite").save(),
        "count tcp": lambda: spark.table("faraway.loopback").count(),
        "count file": lambda: spark.table("exchange.loopback").count(),
    }
    assert spark.table("faraway.loopback").count() == args.rows  # warm-up, and the rows are all there
    got: dict[str, list[tuple[float, float, float]]] = {r: [] for r in routes}
    for r in range(args.rounds):
        for name in (list(routes) if r % 2 == 0 else list(routes)[::-1]):
            j0, s0, t0 = cpu_seconds(jvm), cpu_seconds(service), time.perf_counter()
            routes[name]()
            got[name].append((time.perf_counter() - t0, cpu_seconds(jvm) - j0, cpu_seconds(service) - s0))
    spark.stop()
    load = os.getloadavg()
    print(f"\n{args.rows:,} lineitem rows, {size / 1e6:,.0f} MB held ({args.codec}); medians of {args.rounds}; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| route | s | MB/s | vs socket copy | JVM CPU s | service CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    sock = statistics.median(t for t, _, _ in got["socket"])
    for name, runs in got.items():
        s = statistics.median(t for t, _, _ in runs)
        print(f"| {name} | {s:.2f} | {size / s / 1e6:,.0f} | {sock / s:.2f} | "
              f"{statistics.median(j for _, j, _ in runs):.2f} | {statistics.median(v for _, _, v in runs):.2f} |")


if __name__ == "__main__":
    main()
