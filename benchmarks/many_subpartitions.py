"""Write cost against the number of subpartitions per writer.

Producer processes (each like one Spark write task) hash-partition the same rows (two int64 columns,
batches of 10,000 rows like Spark's maxRecordsPerBatch) into 8, 1,000 and 4,000 subpartitions of a
HYBRID exchange on a real service over its Unix socket (shared memory on unless ``--no-shm``). Reported
per case: write seconds (the slowest producer, first batch to finish), the producer's peak RSS
(VmHWM, the process is fresh per case; "before write" is its peak with the rows generated, before the
writer exists), the producer's CPU seconds (all threads; steadier than wall time on a busy machine) and
the ratios to the 8-subpartition write of the same run (best of ``--repeat`` interleaved rounds).
"Arrow peak" is the most Arrow memory the writer allocated (the rows are NumPy memory handed over batch by
batch, as a Spark task hands them): the writer's own memory, bounded by ``sortBufferSize`` and ``bufferSize``.
With ``--check`` every subpartition is read back and compared with what the selector put there.
Every process started here is stopped by its pid; the temp dir is removed.
Run: .venv/bin/python benchmarks/many_subpartitions.py [--rows 2m] [--producers 1] [--subs 8,1000,4000]
``--profile 4000`` runs that case's producer under cProfile and prints its top functions.
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

import numpy as np
import pyarrow as pa

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.process import client_config, start_service

BATCH_ROWS = 10_000
SCHEMA = pa.schema([pa.field("key", pa.int64(), nullable=False), pa.field("value", pa.int64(), nullable=False)])


def batches(index: int, rows: int):
    for start in range(0, rows, BATCH_ROWS):
        seq = np.arange(start, min(start + BATCH_ROWS, rows), dtype=np.int64) + index * rows
        yield pa.record_batch([pa.array(seq * 2654435761 % 1_000_003), pa.array(seq)], schema=SCHEMA)


def vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def producer(args: argparse.Namespace) -> None:
    config = ExchangeConfig.load(json.loads(args.config), spark_conf={})
    handle = wh.WriteHandle(config, **json.loads(args.handle))
    data = list(batches(args.index, args.rows))  # generated before the clock (and counted in RSS before too)
    base_rss = vm_hwm_mib()
    task = ex.ProducerTask(handle, args.index, f"bench-{args.index}")
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    cpu0 = time.process_time()
    start = time.perf_counter()
    data.reverse()

    def handed_over():  # like a Spark task, the producer keeps no batch it has written
        while data:
            yield data.pop()

    pa.default_memory_pool().release_unused()
    pool_before = pa.total_allocated_bytes()
    task.write(handed_over())
    written = time.perf_counter()
    result = task.finish()
    result["finish_s"] = time.perf_counter() - written
    result["seconds"] = time.perf_counter() - start
    result["cpu"] = time.process_time() - cpu0  # all the producer's threads; less disturbed by a busy machine
    if profiler is not None:
        import pstats
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(35)
    result["rss_mib"] = vm_hwm_mib()
    # the rows are NumPy memory; what Arrow allocated is the writer's own (grouping, encoding)
    result["arrow_peak_mib"] = (pa.default_memory_pool().max_memory() - pool_before) / 2**20
    result["base_rss_mib"] = base_rss
    result["buffers"] = task.writer.buffers_pushed
    result["flushes"] = getattr(task.records, "sort_flushes", 0)
    result["credit_wait"] = task.writer.backpressure_seconds
    print(json.dumps(result), flush=True)


def run_case(svc, subs: int, args: argparse.Namespace, check: bool) -> dict:
    name = f"many-{subs}-{time.monotonic_ns()}"
    options = dict(exchange=name, partitioner="hash", keys="key", numSubpartitions=subs, partitionType="HYBRID",
                   hostId=svc.info["host_id"], service=svc.tcp if args.no_shm else svc.unix,
                   sharedMemory=not args.no_shm, **json.loads(os.environ.get("BENCH_OPTS", "{}")))
    config = client_config(svc, **options)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    fields = {k: getattr(handle, k) for k in ("name", "epoch", "write_id", "schema_b64", "num_subpartitions",
                                               "partitioner")}
    procs = []
    for index in range(args.producers):
        cmd = [sys.executable, __file__, "--role", "producer", "--rows", str(args.rows), "--index", str(index),
               "--config", json.dumps(config.to_keys()), "--handle", json.dumps(fields)]
        if args.profile == subs and index == 0:
            cmd.append("--profile")
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    results = []
    try:
        for p in procs:
            out = p.stdout.read().strip().splitlines()
            p.wait(600)
            if p.returncode != 0 or not out:
                raise RuntimeError(f"producer exited with {p.returncode}")
            results.append(json.loads(out[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    wh.commit_write(handle, [r["partition"] for r in results])
    if check:
        verify(config, subs, args)
    ex.drop_exchange(name, config)
    return {"subs": subs, "seconds": max(r["seconds"] for r in results), "cpu": max(r["cpu"] for r in results),
            "arrow_peak_mib": max(r["arrow_peak_mib"] for r in results), "flushes": sum(r["flushes"] for r in results),
            "finish_s": max(r["finish_s"] for r in results),
            "rss_mib": max(r["rss_mib"] for r in results), "base_rss_mib": max(r["base_rss_mib"] for r in results),
            "buffers": sum(r["buffers"] for r in results), "credit_wait": max(r["credit_wait"] for r in results)}


def verify(config: ExchangeConfig, subs: int, args: argparse.Namespace) -> None:
    """Every subpartition holds exactly the rows the hash selector sends it, each producer's in order."""
    from sparkflow_exchange.writer.selectors import make_selector
    selector = make_selector("hash", subs, 0, SCHEMA, keys=("key",))
    expected: list[list[np.ndarray]] = [[] for _ in range(subs)]
    for index in range(args.producers):
        for b in batches(index, args.rows):
            targets = selector.select(b)
            values = b.column("value").to_numpy()
            order = np.argsort(targets, kind="stable")
            bounds = np.searchsorted(targets[order], np.arange(subs + 1))
            for s in range(subs):
                if bounds[s + 1] > bounds[s]:
                    expected[s].append(values[order[bounds[s]:bounds[s + 1]]])
    desc = ex.describe_exchange(config)
    for s in range(subs):
        got = pa.Table.from_batches(list(ex.read_subpartition(config, desc, s)), schema=SCHEMA).column("value")
        got = np.asarray(got.to_numpy())
        want = np.concatenate(expected[s]) if expected[s] else np.array([], np.int64)
        # producers interleave; each producer's rows are its own contiguous value range, in order
        got_sorted_by_producer = np.concatenate([got[(got // args.rows) == p] for p in range(args.producers)]) \
            if len(got) else got
        assert np.array_equal(got_sorted_by_producer, want), f"subpartition {s}: rows differ"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", default="main")
    parser.add_argument("--rows", default="2m", help="rows per producer")
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--subs", default="8,1000,4000")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--config")
    parser.add_argument("--handle")
    parser.add_argument("--profile", nargs="?", const=True, default=None)
    parser.add_argument("--no-shm", action="store_true", help="push over TCP, no shared memory")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of each case is reported")
    parser.add_argument("--check", action="store_true", help="read every subpartition back and compare")
    args = parser.parse_args()
    text = str(args.rows).lower()
    args.rows = int(float(text[:-1]) * {"k": 1e3, "m": 1e6}[text[-1]]) if text[-1] in "km" else int(text)
    if args.role == "producer":
        producer(args)
        return
    args.profile = int(args.profile) if args.profile not in (None, True) else None
    tmp = Path(tempfile.mkdtemp(prefix="sparkflow-many-"))
    os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = str(tmp / "runtime")
    svc = None
    try:
        svc = start_service(tmp / "svc", host_id="benchhost")
        rounds = [[run_case(svc, int(s), args, args.check and r == 0) for s in args.subs.split(",")]
                  for r in range(args.repeat)]  # interleaved rounds, the best of each case
        cases = [min((rnd[i] for rnd in rounds), key=lambda c: c["seconds"]) for i in range(len(rounds[0]))]
        cpus = [min(rnd[i]["cpu"] for rnd in rounds) for i in range(len(rounds[0]))]
        base = cases[0]
        print(f"{args.producers} producer(s) x {args.rows:,} rows, HYBRID, "
              f"{'TCP' if args.no_shm else 'Unix socket + shared memory'}; best of {args.repeat}; "
              f"ratios to {base['subs']} subpartitions")
        print(f"{'subpartitions':>13s} {'write s':>8s} {'ratio':>6s} {'CPU s':>6s} {'ratio':>6s} {'peak RSS MiB':>13s} "
              f"{'(before write)':>14s} {'Arrow peak MiB':>14s} {'pushes':>7s} {'flushes':>7s} {'credit wait s':>13s} {'finish s':>8s}")
        for c, cpu in zip(cases, cpus):
            print(f"{c['subs']:13d} {c['seconds']:8.2f} {c['seconds'] / base['seconds']:6.2f} {cpu:6.2f} "
                  f"{cpu / cpus[0]:6.2f} {c['rss_mib']:13.0f} {c['base_rss_mib']:14.0f} {c['arrow_peak_mib']:14.0f} {c['buffers']:7d} {c['flushes']:7d} "
                  f"{c['credit_wait']:13.2f} {c['finish_s']:8.2f}")
    finally:
        if svc is not None:
            svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
