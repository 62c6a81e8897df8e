"""Metadata at scale: 2,000 producers x 2,000 subpartitions through the coordinator, no data.

Against a real service process (its own temp dir, stopped by pid), over RPC as the write tasks and
the planner would: declare an exchange without numSubpartitions; register every producer (the first
fixes the width); finish each with its per-subpartition byte counts; commit; describe (what a read
plans from, summed sizes included) and ``status``. A subscriber watches throughout, so the delta
notifications are paid for too; the bytes it received are printed (linear in producers, not square).
Each phase's seconds are printed, and their sum.
Run: .venv/bin/python benchmarks/metadata.py [--producers 2000] [--subpartitions 2000]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkflow_exchange.buffer import schema_to_b64  # noqa: E402
from sparkflow_exchange.network.protocol import Notify, encode_bytes  # noqa: E402
from sparkflow_exchange.service.process import start_service  # noqa: E402

# the made-up host service sends no heartbeat: the coordinator must not declare it lost during a run
QUIET_HOST = {"heartbeatTimeout": "3600"}


def run(svc, producers: int, subpartitions: int, name: str = "meta") -> dict:
    """Drive one exchange's metadata through ``svc``; returns seconds per phase and what came back."""
    import pyarrow as pa

    schema = schema_to_b64(pa.schema([pa.field("key", pa.int64())]))
    rng = np.random.default_rng(7)
    # the producers' partitions live on another host's service, registered with the coordinator as a host's
    # service registers itself (no data moves, so none runs there: the drop's releases to it are best effort)
    location = {"tcp": "127.0.0.1:9", "unix": "", "host_id": "metadata-host", "service_id": "metadata-service"}
    times: dict[str, float] = {}
    with svc.connect() as conn, svc.connect() as watcher:
        conn.call("register_service", service_id=location["service_id"], host_id=location["host_id"],
                  tcp=location["tcp"], unix=location["unix"], pid=1)
        t = time.perf_counter()
        desc = conn.call("declare", name=name, schema=schema, num_subpartitions=None,
                         partitioner={"name": "hash", "keys": ["key"], "custom": None, "shared": False},
                         partition_type="HYBRID", mode="overwrite", coalesce=True)
        watcher.call("subscribe", name=name, topic="watch")
        times["declare"] = time.perf_counter() - t
        epoch, write_id = desc["epoch"], desc["write_id"]
        pids = [f"{name}.{epoch}.{i}.{i}-0-{i}.abcdef01" for i in range(producers)]
        t = time.perf_counter()
        for i, pid in enumerate(pids):
            conn.call("register_producer", name=name, epoch=epoch, write_id=write_id, index=i, attempt=f"{i}-0-{i}",
                      partition=pid, location=location, num_subpartitions=subpartitions)
        times["register"] = time.perf_counter() - t
        expected = np.zeros(subpartitions, np.int64)
        sizes = [rng.integers(0, 1 << 20, subpartitions) for _ in range(8)]  # made up, reused to keep setup short
        t = time.perf_counter()
        for i, pid in enumerate(pids):
            s = sizes[i % len(sizes)]
            expected += s
            conn.call("producer_finished", name=name, epoch=epoch, partition=pid, spill=f"/spill/{pid}.data",
                      subpartition_bytes=s.tolist())
        times["finish"] = time.perf_counter() - t
        t = time.perf_counter()
        conn.call("commit", name=name, epoch=epoch, write_id=write_id, partitions=pids)
        times["commit"] = time.perf_counter() - t
        t = time.perf_counter()
        described = conn.call("get_exchange", name=name, need_subpartitions=True)
        times["describe"] = time.perf_counter() - t
        t = time.perf_counter()
        status = conn.call("status", timeout=60)
        times["status"] = time.perf_counter() - t
        notes = [m for m in watcher.poll() if isinstance(m, Notify)]
        deadline = time.monotonic() + 10
        while not (notes and notes[-1].body.get("sealed")) and time.monotonic() < deadline:
            msg = watcher.recv(1.0)
            if isinstance(msg, Notify):
                notes.append(msg)
        conn.call("drop", name=name)
    return {"times": times, "described": described, "status": status, "expected_bytes": expected.tolist(),
            "notifications": len(notes), "notification_bytes": sum(len(encode_bytes(m)) for m in notes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=2000)
    parser.add_argument("--subpartitions", type=int, default=2000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sparkflow-bench-meta-"))
    svc = start_service(tmp / "svc", conf=QUIET_HOST)
    try:
        result = run(svc, args.producers, args.subpartitions)
        times = result["times"]
        print(f"{args.producers} producers x {args.subpartitions} subpartitions, metadata only")
        for phase, seconds in times.items():
            print(f"  {phase:<9} {seconds:7.3f} s")
        print(f"  {'total':<9} {sum(times.values()):7.3f} s   ")
        print(f"  notifications to one subscriber: {result['notifications']} messages, "
              f"{result['notification_bytes'] / 1e6:.2f} MB")
        print(f"  service RSS after: {svc.rss_bytes() / 2**20:.0f} MiB")
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
