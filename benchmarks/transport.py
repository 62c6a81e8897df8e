"""Transport benchmark: credit-controlled transfers through the exchange vs a raw socket copy.

The same number of bytes moves from one process to another on every path:

* raw TCP / raw Unix: a plain socket sender (``sendall`` of 1 MiB chunks) and receiver (``recv_into``),
  with the same 4 MiB kernel socket buffers the exchange's connections use;
* remote channel (TCP): a result partition held in the service's memory, read by an input gate on
  another host (hostId) over TCP, under credit: the channel alone, like the raw copy;
* local channel (Unix socket): the same with the gate on the service's host;
* local spill file: a finished BLOCKING partition read straight from its spill file;
* end to end (extra): a producer process pushes while the gate reads (PIPELINED_BOUNDED with the
  default pool of 16 buffers), producer -> service -> consumer: the writer is on the service's host,
  as in every deployment (Unix socket, shared-memory slots), the reader's host picks the channel.

For the channel paths the producer fills the partition first (its pool is made large enough to hold
it, no disk involved) and only the read is timed; the spill-file path is timed the same way.
Every payload is an Arrow record batch of ``bufferSize`` bytes (the default). Each round measures
every path once, raw beside exchange; ``--repeat`` rounds, the best of each path is reported (the
2-core machine is shared, so single runs are noisy). Every process started here is stopped by its
pid; the temp dir is removed.
Run: .venv/bin/python benchmarks/transport.py [--size 1g] [--repeat 3]
Knobs for experiments: ``BENCH_OPTS='{"bufferSize": "4m"}'`` adds exchange options to every exchange
path; ``BENCH_DEBUG=1`` prints each streaming producer's figures (CPU, credit waits, shared memory).

The checksum's price on the spill-file path is measured in the same run: the path
is read once more with this process's decode swapped for one that skips the CRC32C check (benchmark
only; the package has no setting that turns the check off). ``--only spill`` runs just the raw Unix
copy and the spill-file variants: read from the mapping (large buffers; what the package does) and with
``pread`` copies, each with and without the check. ``--consume``: the reader
sums every batch (reads every byte, as Spark does when it passes a batch on) instead of only counting it:
a mapped buffer read without the check is otherwise never touched at all.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import TRAILER_SIZE
from sparkflow_exchange.config import ExchangeConfig, parse_size
from sparkflow_exchange.consumer import input_gate, spill_data
from sparkflow_exchange.network.blocking_client import tune_socket
from sparkflow_exchange.service.process import client_config, start_service

CHUNK = 1 << 20
CONSUME = False  # --consume


def batch_of(nbytes: int) -> pa.RecordBatch:
    rows = nbytes // 8
    return pa.record_batch([pa.array(np.arange(rows, dtype=np.int64))], names=["v"])


# ------------------------------------------------------------------ raw copy
def raw_sender(family: str, address: str, size: int) -> None:
    if family == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
    else:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
    tune_socket(sock)  # the same kernel buffers as the exchange's connections: the baseline is no weaker
    chunk = bytes(CHUNK)
    sent = 0
    while sent < size:
        sock.sendall(chunk)
        sent += CHUNK
    sock.close()


def raw_copy(family: str, size: int, tmp: Path) -> float:
    if family == "unix":
        path = str(tmp / "raw.sock")
        if os.path.exists(path):
            os.unlink(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        address = path
    else:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{server.getsockname()[1]}"
    server.listen(1)
    sender = subprocess.Popen([sys.executable, __file__, "--role", "raw-sender", "--family", family,
                               "--address", address, "--size", str(size)])
    try:
        return _raw_receive(server, sender, size)
    finally:
        server.close()
        if sender.poll() is None:
            sender.kill()
            sender.wait(10)


def _raw_receive(server: socket.socket, sender: subprocess.Popen, size: int) -> float:
    server.settimeout(60)
    conn, _ = server.accept()
    tune_socket(conn)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    got = 0
    start = time.perf_counter()
    while True:
        n = conn.recv_into(view)
        if not n:
            break
        got += n
    elapsed = time.perf_counter() - start
    conn.close()
    sender.wait(60)
    assert got >= size, (got, size)
    return elapsed


# ------------------------------------------------------------------ exchange
def _decode_unchecked(payload, schema: pa.Schema) -> pa.RecordBatch:
    buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    return ipc.read_record_batch(buf.slice(0, len(buf) - TRAILER_SIZE), schema)


@contextlib.contextmanager
def spill_variant(checksum: bool = True, mapped: bool = True):
    """Benchmark only: the gate's decode without its CRC32C check, and/or spill buffers read with pread."""
    decode, map_min = input_gate.decode, spill_data.MAP_MIN
    if not checksum:
        input_gate.decode = _decode_unchecked
    if not mapped:
        spill_data.MAP_MIN = 1 << 62
    try:
        yield
    finally:
        input_gate.decode, spill_data.MAP_MIN = decode, map_min


def spill_transfer(svc, size: int, checksum: bool = True, mapped: bool = True) -> tuple[float, int]:
    with spill_variant(checksum, mapped):
        return exchange_transfer(svc, size, "BLOCKING", "benchhost", False)


def producer(args: argparse.Namespace) -> None:
    config = ExchangeConfig.load(json.loads(args.config), spark_conf={})
    handle = wh.WriteHandle(config, **json.loads(args.handle))
    task = ex.ProducerTask(handle, 0, "bench")
    batch = batch_of(config.buffer_size - 1024)
    count = args.size // batch.nbytes
    print("ready", flush=True)
    sys.stdin.readline()  # the consumer starts its clock, then says go
    start = time.perf_counter()
    task.write(batch for _ in range(count))
    result = task.finish()
    result["producer_seconds"] = time.perf_counter() - start
    result["waited_for_credit"] = task.writer.backpressure_seconds
    result["shared_memory"] = task.writer.arena is not None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(result), flush=True)


def exchange_transfer(svc, size: int, partition_type: str, reader_host: str, streaming: bool) -> tuple[float, int]:
    name = f"bench-{partition_type}-{reader_host}-{time.monotonic_ns()}"
    options = dict(exchange=name, partitioner="forward", numSubpartitions=1, partitionType=partition_type,
                   hostId=svc.info["host_id"], service=svc.unix, **json.loads(os.environ.get("BENCH_OPTS", "{}")))
    if not streaming and partition_type == "PIPELINED_BOUNDED":  # the pool holds the whole transfer
        options.setdefault("buffersPerPartition", size // ExchangeConfig().buffer_size + 16)
    config = client_config(svc, **options)
    schema = batch_of(64).schema
    handle = ex.declare_write(config, schema, overwrite=True)
    fields = {k: getattr(handle, k) for k in ("name", "epoch", "write_id", "schema_b64", "num_subpartitions",
                                               "partitioner")}
    producer_cmd = [sys.executable, __file__, "--role", "producer", "--size", str(size),
                    "--config", json.dumps(config.to_keys()), "--handle", json.dumps(fields)]
    reader_config = client_config(svc, **{**options, "hostId": reader_host})
    proc = subprocess.Popen(producer_cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        return _exchange_run(proc, handle, config, reader_config, name, streaming)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _exchange_run(proc, handle, config, reader_config, name: str, streaming: bool) -> tuple[float, int]:
    assert proc.stdout.readline().strip() == "ready"  # imported and registered: only the transfer is timed
    if not streaming:  # written first, read afterwards
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.read().strip().splitlines()[-1])
        proc.wait(120)
        wh.commit_write(handle, [result["partition"]])
    desc = ex.describe_exchange(reader_config)
    got = 0
    start = time.perf_counter()
    it = ex.read_subpartition(reader_config, desc, 0)
    if streaming:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        # the gate ends at commit; commit as soon as the producer is done
        def committer() -> None:
            result = json.loads(proc.stdout.read().strip().splitlines()[-1])
            if os.environ.get("BENCH_DEBUG"):
                print("producer", result, file=sys.stderr)
            proc.wait(120)
            wh.commit_write(handle, [result["partition"]])

        t = threading.Thread(target=committer, daemon=True)
        t.start()
    for b in it:
        got += b.nbytes
        if CONSUME:  # the reader uses every byte, as Spark does when it sends a batch on to the JVM
            pc.sum(b.column(0))
    elapsed = time.perf_counter() - start
    if streaming:
        t.join(60)
    ex.drop_exchange(name, config)
    return elapsed, got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1g")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of each path is reported")
    parser.add_argument("--role", default="main")
    parser.add_argument("--family")
    parser.add_argument("--address")
    parser.add_argument("--config")
    parser.add_argument("--handle")
    parser.add_argument("--only", choices=["spill"], help="spill: just the raw Unix copy and the spill-file paths")
    parser.add_argument("--consume", action="store_true",
                        help="the reader sums every batch's column (uses every byte) instead of only counting")
    parser.add_argument("--out", default=str(Path(__file__).parent / "transport-latest.json"))
    args = parser.parse_args()
    size = parse_size(args.size)
    global CONSUME
    CONSUME = args.consume
    args.size = size
    if args.role == "raw-sender":
        raw_sender(args.family, args.address, size)
        return
    if args.role == "producer":
        producer(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="sparkflow-bench-"))
    svc = None
    try:
        svc = start_service(tmp / "svc", host_id="benchhost", conf={"memory.budget": str(2 * size + (256 << 20))})
        load_before = os.getloadavg()[0]
        paths = {  # label -> (run, baseline label)
            "raw TCP copy": (lambda: (raw_copy("tcp", size, tmp), size), None),
            "remote channel (TCP)": (
                lambda: exchange_transfer(svc, size, "PIPELINED_BOUNDED", "otherhost", False), "raw TCP copy"),
            "end to end, remote reader (extra)": (
                lambda: exchange_transfer(svc, size, "PIPELINED_BOUNDED", "otherhost", True), "raw TCP copy"),
            "raw Unix socket copy": (lambda: (raw_copy("unix", size, tmp), size), None),
            "local channel (Unix socket)": (
                lambda: exchange_transfer(svc, size, "PIPELINED_BOUNDED", "benchhost", False), "raw Unix socket copy"),
            "end to end, local reader (extra)": (
                lambda: exchange_transfer(svc, size, "PIPELINED_BOUNDED", "benchhost", True), "raw Unix socket copy"),
            "local spill file (BLOCKING)": (lambda: spill_transfer(svc, size), "raw Unix socket copy"),
            "local spill file, checksum off (benchmark only)": (
                lambda: spill_transfer(svc, size, checksum=False), "raw Unix socket copy"),
        }
        if args.only == "spill":
            paths = {k: v for k, v in paths.items() if "spill" in k or k == "raw Unix socket copy"}
            paths["local spill file, pread copies"] = (
                lambda: spill_transfer(svc, size, mapped=False), "raw Unix socket copy")
            paths["local spill file, pread copies, checksum off"] = (
                lambda: spill_transfer(svc, size, checksum=False, mapped=False), "raw Unix socket copy")
        runs: dict[str, list[tuple[float, int]]] = {label: [] for label in paths}
        for _ in range(args.repeat):  # interleaved: each exchange path right after its raw baseline
            for label, (run, _base) in paths.items():
                runs[label].append(run())
        best = {label: min(r, key=lambda t: t[0] / max(t[1], 1)) for label, r in runs.items()}
        results = {}
        print(f"{'path':48s} {'seconds':>8s} {'MB/s':>8s} {'vs raw':>7s}   (best of {args.repeat}; all MB/s)")
        for label, (_run, base) in paths.items():
            secs, nbytes = best[label]
            mbps = nbytes / 1e6 / secs
            base_mbps = best[base][1] / 1e6 / best[base][0] if base else mbps
            ratio = mbps / base_mbps
            every = " ".join(f"{n / 1e6 / t:.0f}" for t, n in runs[label])
            print(f"{label:48s} {secs:8.2f} {mbps:8.0f} {ratio:7.2f}   [{every}]")
            results[label] = {"seconds": secs, "bytes": nbytes, "MBps": mbps, "ratio_to_raw": ratio,
                              "baseline": base, "all_MBps": [n / 1e6 / t for t, n in runs[label]]}
        cost = {}
        for checked, unchecked in (("local spill file (BLOCKING)", "local spill file, checksum off (benchmark only)"),
                                   ("local spill file, pread copies", "local spill file, pread copies, checksum off")):
            if checked in best and unchecked in best:
                ratio = (best[checked][0] / best[checked][1]) / (best[unchecked][0] / best[unchecked][1])
                cost[checked] = ratio - 1
                print(f"checksum cost on {checked!r}: {100 * (ratio - 1):+.1f} % time (with / without the check)")
        load_after = os.getloadavg()[0]
        Path(args.out).write_text(json.dumps({
            "size": size, "repeat": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(),
            "loadavg_before_after": [load_before, load_after], "buffer_size": ExchangeConfig().buffer_size,
            "results": results, "checksum_cost": cost}, indent=2))
        print(f"({size / 1e6:.0f} MB per path; bufferSize {ExchangeConfig().buffer_size} bytes; "
              f"{os.cpu_count()} CPUs, load average {load_before:.1f} before, {load_after:.1f} after)")
    finally:
        if svc is not None:
            svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
