"""What ``replicas=1`` costs a write, across network-namespace hosts: write throughput with and without a copy.

Three hosts built as ``tests/multihost.py`` builds them (network namespaces on one bridge, 198.18.0.0/24): the
coordinator on host0, ``serve --no-coordinator`` on host1 and host2, TLS off, no Spark. On host1, one process writes
``--rows`` rows (an int64 key, an int64, a float64 and a short string: about 36 bytes a row) with ``open_writer``,
hashed into 8 subpartitions, into host1's service, per codec with ``replicas=0`` and ``replicas=1`` (the copy goes to
host0's or host2's service over the link), rounds alternating the routes (reversed every other round); each timed
write is dropped after it. Reported per route: the median seconds of ``--rounds``, the rows' Arrow MB/s, and the
ratio to the same codec without a copy. ``--shaped``: host1's link in both directions through a 1 Gbit/s token
bucket (``multihost_read.py``'s shaping). The machine's load average is printed before and after.

Needs root, ``ip``, ``unshare``, ``nsenter``, ``openssl`` (and ``tc`` for ``--shaped``).
Run: .venv/bin/python benchmarks/replicas.py [--rows 2000000] [--rounds 3] [--codecs none,lz4] [--shaped]
Writes benchmarks/replicas-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"


def write_rounds(rows: int, codecs: list[str], rounds: int) -> None:
    """host1: the timed writes, as JSON."""
    import numpy as np
    import pyarrow as pa

    import sparkflow_exchange as sfe

    rng = np.random.default_rng(7)
    batch_rows = 65_536
    batches = []
    for first in range(0, rows, batch_rows):
        n = min(batch_rows, rows - first)
        batches.append(pa.record_batch({
            "key": pa.array(np.arange(first, first + n, dtype=np.int64)),
            "value": pa.array(rng.integers(0, 1 << 40, n, dtype=np.int64)),
            "price": pa.array(rng.random(n)),
            "tag": pa.array(np.char.add("tag-", (rng.integers(0, 1000, n)).astype(str)).astype(object)),
        }))
    raw = sum(b.nbytes for b in batches)
    routes = [(codec, replicas) for codec in codecs for replicas in (0, 1)]
    times: dict[str, list[float]] = {f"{c}/{r}": [] for c, r in routes}
    held: dict[str, int] = {}
    for r in range(rounds):
        for codec, replicas in (routes if r % 2 == 0 else routes[::-1]):
            name = f"rep_{codec}_{replicas}"
            started = time.perf_counter()
            with sfe.open_writer(name, batches[0].schema, keys=["key"], num_subpartitions=8, compression=codec,
                                 replicas=replicas) as w:
                for b in batches:
                    w.write(b)
            times[f"{codec}/{replicas}"].append(time.perf_counter() - started)
            held[name] = next(s.bytes for s in sfe.list_exchanges() if s.name == name)
            sfe.drop_exchange(name)
    print(json.dumps({"rows": rows, "raw_bytes": raw, "times": times, "held": held}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codecs", default="none,lz4")
    parser.add_argument("--shaped", action="store_true")
    parser.add_argument("--part", action="store_true", help=argparse.SUPPRESS)  # the write, run inside host1
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    if args.part:
        write_rounds(args.rows, codecs, args.rounds)
        return
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(HERE))
    import multihost
    from multihost_read import _json, _shape

    why = multihost.unavailable()
    if why:
        sys.exit(f"cannot build hosts: {why}")

    class Hosts(multihost.Cluster):
        """The test cluster without Spark and without TLS."""

        def _spark(self) -> None:
            pass

        def spark_defaults(self, host) -> str:
            return "\n".join(line for line in super().spark_defaults(host).splitlines() if ".tls." not in line) + "\n"

    load_before = os.getloadavg()
    me = [multihost.PYTHON, str(Path(__file__).resolve()), "--rows", str(args.rows), "--rounds", str(args.rounds),
          "--codecs", args.codecs, "--part"]
    with Hosts(hosts=3) as cluster:
        if args.shaped:
            _shape(cluster, cluster.hosts[1], True)
        out = _json(cluster.hosts[1].run(me, timeout=3600), "the writes on host1")
    out.update(load_before=load_before, load_after=os.getloadavg(), cpus=os.cpu_count(), shaped=args.shaped,
               rounds=args.rounds, codecs=codecs)
    (HERE / "replicas-latest.json").write_text(json.dumps(out, indent=1))
    report(out)


def report(out: dict) -> None:
    raw = out["raw_bytes"]
    link = "host1's link shaped to 1 Gbit/s" if out["shaped"] else "unshaped veth links"
    print(f"\n{out['rows']:,} rows, {raw / 1e6:,.0f} MB of Arrow, written on host1; {link}; medians of {out['rounds']}; "
          f"load average {out['load_before'][0]:.1f} before, {out['load_after'][0]:.1f} after ({out['cpus']} cpus)")
    print("| codec | replicas | s | raw MB/s | held MB (one copy) | vs replicas=0 |")
    print("|---|---:|---:|---:|---:|---:|")
    for codec in out["codecs"]:
        base = statistics.median(out["times"][f"{codec}/0"])
        for replicas in (0, 1):
            s = statistics.median(out["times"][f"{codec}/{replicas}"])
            print(f"| {codec} | {replicas} | {s:.2f} | {raw / s / 1e6:,.0f} | "
                  f"{out['held'][f'rep_{codec}_{replicas}'] / 1e6:,.0f} | {base / s:.2f} |")


if __name__ == "__main__":
    main()
