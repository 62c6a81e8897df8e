"""The two ends of a stream hop outside Spark, each its own process (``streaming.py --only hop`` runs them).

``producer``: writes stream ``--stream`` (or parquet files into ``--files``) at ``--rate`` rows/s, a batch every
2 ms, each row (id, ts_us) stamped with the wall clock when it is handed to the writer (``bufferTimeout`` 1 ms).
An epoch is committed every ``--epoch-ms`` (0: one epoch, committed at the end: a Real-time Mode reader reads it as
it is written); a file is written (to a hidden name, then renamed) every ``--epoch-ms``. It declares the stream,
prints ``ready``, waits for ``go`` on stdin, writes for ``--seconds``, prints ``sent <rows> <seconds>``.

``consumer``: reads stream ``--stream``'s epochs as they are written (subpartition 0, every producer) and stamps
each batch's arrival; on ``total <rows>`` from stdin it waits for that many rows (up to ``--grace`` s), then saves
(id, latency µs) to ``--out`` (.npy) and prints ``got <rows>``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkflow_exchange import exchange as ex
from sparkflow_exchange.buffer_kinds import epoch_marker
from sparkflow_exchange.calls import call
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.spark import streaming as st

SCHEMA = pa.schema([("id", pa.int64()), ("ts_us", pa.int64())])
BATCH_EVERY = 0.002  # the producer hands over a batch every 2 ms


def config(stream: str) -> ExchangeConfig:
    return ExchangeConfig.load().replace(exchange=stream, num_subpartitions=1, partitioner="rebalance",
                                         buffer_timeout=0.001)


def batches(rate: int, seconds: float, counter: list[int]):
    """Batches due every 2 ms at ``rate`` rows/s for ``seconds``; ``counter[0]``: rows handed over."""
    yield from batches_until(rate, time.monotonic(), seconds, counter)  # the schedule begins at the first batch


def produce(args) -> None:
    counter = [0]
    if args.files:
        out = Path(args.files)
        out.mkdir(parents=True, exist_ok=True)
        print("ready", flush=True)
        sys.stdin.readline()
        start, wall = time.monotonic(), time.time()
        held: list[pa.RecordBatch] = []
        last = time.monotonic()
        n = 0

        def write_file():
            nonlocal held, last, n
            if held:
                tmp = out / f".{n:08d}.parquet"
                pq.write_table(pa.Table.from_batches(held), tmp)
                os.rename(tmp, out / f"part-{n:08d}.parquet")
                n += 1
            held, last = [], time.monotonic()

        for b in batches(args.rate, args.seconds, counter):
            held.append(b)
            if time.monotonic() - last >= args.epoch_ms / 1000:
                write_file()
        write_file()
        print(f"sent {counter[0]} {time.monotonic() - start:.3f} {wall:.3f}", flush=True)
        return
    handle = st.declare_stream(config(args.stream), SCHEMA)
    epoch = 0
    write = st.begin_epoch(handle, epoch, "hop-producer")
    print("ready", flush=True)
    sys.stdin.readline()
    start, wall = time.monotonic(), time.time()
    per_epoch = args.epoch_ms / 1000 if args.epoch_ms else args.seconds
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= args.seconds:
            break
        task = ex.ProducerTask(write, 0, f"0-{epoch}-0")
        task.write(batches_until(args.rate, start, min(args.seconds, elapsed + per_epoch), counter))
        result = task.finish(epoch_marker(epoch))
        st.commit_epoch(handle, epoch, [result["partition"]], {result["partition"]: result["rows"]})
        epoch += 1
        if time.monotonic() - start < args.seconds:
            write = st.begin_epoch(handle, epoch, "hop-producer")
    print(f"sent {counter[0]} {time.monotonic() - start:.3f} {wall:.3f}", flush=True)


def batches_until(rate: int, start: float, until: float, counter: list[int]):
    """As :func:`batches`, on the schedule that began at ``start``, up to ``until`` s after it."""
    per_batch = max(1, int(rate * BATCH_EVERY))
    while time.monotonic() - start < until:
        pause = start + counter[0] / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        sent = counter[0]
        counter[0] += per_batch
        yield pa.RecordBatch.from_arrays(
            [pa.array(np.arange(sent, sent + per_batch, dtype=np.int64)),
             pa.array(np.full(per_batch, time.time_ns() // 1000, dtype=np.int64))], schema=SCHEMA)


def consume(args) -> None:
    base = config(args.stream)
    got: list[tuple[np.ndarray, np.ndarray]] = []
    count = [0]
    stop = threading.Event()

    def run() -> None:
        epoch = 0
        while not stop.is_set():
            try:
                desc = ex.describe_exchange(base.replace(exchange=f"{args.stream}#{epoch}", declare_timeout=0.5))
            except Exception:  # noqa: BLE001 - not declared yet, or committed empty (then skipped)
                try:
                    state = call(base, "stream_describe", name=args.stream, wait=0)
                    if state.get("last_committed", -1) >= epoch:
                        plan = call(base, "stream_plan", name=args.stream, after=epoch - 1, upto=epoch)
                        if not plan.get("epochs"):
                            epoch += 1
                except Exception:  # noqa: BLE001 - the stream itself is not declared yet
                    time.sleep(0.05)
                continue
            for batch in ex.read_subpartition(base, desc, 0, marker=epoch_marker(epoch)):
                now = time.time_ns() // 1000
                got.append((batch.column(0).to_numpy(), now - batch.column(1).to_numpy()))
                count[0] += batch.num_rows
            epoch += 1

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    print("ready", flush=True)
    total = int(sys.stdin.readline().split()[1])
    deadline = time.monotonic() + args.grace
    while count[0] < total and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    ids = np.concatenate([g[0] for g in got]) if got else np.array([], np.int64)
    lat = np.concatenate([g[1] for g in got]) if got else np.array([], np.int64)
    np.save(args.out, np.stack([ids, lat]))
    print(f"got {len(ids)}", flush=True)
    os._exit(0)  # the reader thread may sit in a read of the next epoch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("role", choices=("producer", "consumer"))
    parser.add_argument("--stream", default="")
    parser.add_argument("--files", default="")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--epoch-ms", type=float, default=0.0)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    logging.getLogger("sparkflow_exchange").setLevel(logging.ERROR)  # "not declared yet" while waiting for B
    (produce if args.role == "producer" else consume)(args)


if __name__ == "__main__":
    main()
