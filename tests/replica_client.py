"""A client run inside a host of tests/test_multihost_replicas.py, configured by the host's spark-defaults.conf:
``write NAME WRITER MODE`` writes rows [WRITER*ROWS, (WRITER+1)*ROWS) with replicas=1; ``read NAME [MID GO WRITER]``
reads every subpartition and prints each one's fingerprint as JSON; with MID and GO it creates the file MID once it
has read part of the partition WRITER wrote, then waits (bounded) for the file GO before it reads on.
``describe NAME FAILED_OVER`` prints the coordinator's description once at least FAILED_OVER of its partitions are
read from a replica; ``alive HOSTS`` prints the hosts of the live services once there are HOSTS of them (each
waits at most a minute: a client's start costs seconds on a loaded machine, so nothing polls from outside)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import sparkflow_exchange as sfe

ROWS = 40_000
SUBPARTITIONS = 2
SCHEMA = pa.schema([("id", pa.int64()), ("writer", pa.int64())])
SMALL = {"bufferSize": "16k", "sortBufferSize": "64k", "compression": "none"}


def write(name: str, writer: int, mode: str) -> dict:
    with sfe.open_writer(name, SCHEMA, keys=["id"], num_subpartitions=SUBPARTITIONS, mode=mode, replicas=1,
                         **SMALL) as w:
        for first in range(writer * ROWS, (writer + 1) * ROWS, 2_000):
            ids = np.arange(first, first + 2_000, dtype=np.int64)
            w.write(pa.record_batch([pa.array(ids), pa.array(np.full(2_000, writer, dtype=np.int64))], schema=SCHEMA))
    return {"ok": True}


def fingerprint(ids: np.ndarray) -> dict:
    """Enough to tell a multiset of ids apart from another here: count, distinct, sum, sum of squares, range."""
    ids = ids.astype(np.int64)
    return {"rows": int(ids.size), "distinct": int(np.unique(ids).size), "sum": int(ids.sum()),
            "squares": int((ids.astype(object) ** 2).sum()) if ids.size else 0,
            "min": int(ids.min()) if ids.size else -1, "max": int(ids.max()) if ids.size else -1}


def read(name: str, mid: str | None = None, go: str | None = None, writer: str = "0") -> dict:
    out = {}
    for sub in range(SUBPARTITIONS):
        ids, writers = [], []
        with sfe.open_reader(name, subpartitions=sub, buffersPerChannel=1, floatingBuffersPerGate=1) as reader:
            for batch in reader:
                ids.append(batch.column("id").to_numpy())
                writers.append(batch.column("writer").to_numpy())
                if mid and not Path(mid).exists() and (writers[-1] == int(writer)).any():  # that partition, part read
                    Path(mid).write_text("reading")
                    deadline = time.monotonic() + 120
                    while not Path(go).exists():
                        if time.monotonic() > deadline:
                            raise SystemExit("the go-ahead never came")
                        time.sleep(0.05)
        got = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        out[str(sub)] = fingerprint(got)
    return out


def until(what: str, check):
    deadline = time.monotonic() + 60
    while not (got := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within 60 s")
        time.sleep(0.1)
    return got


def describe(name: str, failed_over: int) -> dict:
    from sparkflow_exchange.calls import call
    from sparkflow_exchange.config import ExchangeConfig

    config = ExchangeConfig.load({"exchange": name})
    return until(f"{failed_over} partitions of {name} read from replicas", lambda: (
        lambda d: d if d["replication"]["failed_over"] >= failed_over else None)(call(config, "get_exchange", name=name)))


def alive(hosts: int) -> list[str]:
    from sparkflow_exchange.calls import call
    from sparkflow_exchange.config import ExchangeConfig

    config = ExchangeConfig.load()
    return until(f"{hosts} live services", lambda: (lambda a: a if len(a) == hosts else None)(
        sorted(s["host_id"] for s in call(config, "list_services") if s["state"] == "alive")))


if __name__ == "__main__":
    kind, name, *rest = sys.argv[1:]
    result = (write(name, int(rest[0]), rest[1]) if kind == "write" else read(name, *rest) if kind == "read"
              else describe(name, int(rest[0])) if kind == "describe" else alive(int(name)))
    print(json.dumps(result), flush=True)
