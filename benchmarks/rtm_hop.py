"""One Real-time Mode hop through the exchange: a row's push into stream A to its arrival from stream B.

A producer outside Spark (this driver process, the Python client) writes stream A at ``--rate`` rows/s in small
batches, each row stamped with the wall clock (µs) when it is handed to the writer (``bufferTimeout`` 1 ms). One
Spark query in Real-time Mode (``trigger(realTime=...)``, JVM stream source and sink, no Python in the query) reads
A and writes stream B. A consumer outside Spark (a thread of this process) reads B's epochs as they are written and
stamps each batch's arrival; a row's latency = arrival - its stamp: two exchange pushes, the query's read and write,
and both writers' buffer timeouts. Reported: p50/p99/p99.9 per rate, rows counted after ``--warmup-seconds``; every
row must arrive once (checked).

Run: .venv/bin/python benchmarks/rtm_hop.py [--rates 1000,10000] [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from spark_common import bench_environment

TMP = bench_environment("rtm-hop")  # before Spark starts: its workers and embedded service are this run's

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sparkflow_exchange import exchange as ex  # noqa: E402
from sparkflow_exchange.buffer_kinds import epoch_marker  # noqa: E402
from sparkflow_exchange.config import ExchangeConfig  # noqa: E402
from sparkflow_exchange.service.discovery import resolve  # noqa: E402
from sparkflow_exchange.spark import streaming as st  # noqa: E402

JAR = Path(__file__).resolve().parent.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"
SCHEMA = pa.schema([("id", pa.int64()), ("ts_us", pa.int64())])
BATCH_EVERY = 0.002  # the producer hands over a batch every 2 ms


def produce(config: ExchangeConfig, rate: int, seconds: float, go: threading.Event) -> int:
    """Stream A's epoch 0, written at ``rate`` rows/s for ``seconds`` once ``go`` is set (the query runs), then
    committed; the rows written."""
    handle = st.declare_stream(config, SCHEMA)
    write = st.begin_epoch(handle, 0, "rtm-hop-producer")
    task = ex.ProducerTask(write, 0, "0-0-0")
    if not go.wait(120):
        raise RuntimeError("the Real-time Mode query did not start writing stream B within 120 s")
    per_batch = max(1, int(rate * BATCH_EVERY))
    sent = 0

    def batches():
        nonlocal sent
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            due = start + sent / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            ids = np.arange(sent, sent + per_batch, dtype=np.int64)
            stamp = np.full(per_batch, time.time_ns() // 1000, dtype=np.int64)
            sent += per_batch
            yield pa.RecordBatch.from_arrays([pa.array(ids), pa.array(stamp)], schema=SCHEMA)

    task.write(batches())
    result = task.finish(epoch_marker(0))
    st.commit_epoch(handle, 0, [result["partition"]], {result["partition"]: result["rows"]})
    return sent


def consume(config: ExchangeConfig, stream: str, arrivals: list, stop: threading.Event, go: threading.Event) -> None:
    """Stream B's epochs as they are written: (id, latency µs) of every row, stamped per batch. Sets ``go`` once
    the query's first epoch of B is declared (its write task runs)."""
    epoch = 0
    while not stop.is_set():
        try:
            desc = ex.describe_exchange(config.replace(exchange=f"{stream}#{epoch}", declare_timeout=1.0))
        except Exception:  # noqa: BLE001 - not declared yet (or an empty epoch): ask again
            if stop.is_set():
                return
            continue
        go.set()
        for batch in ex.read_subpartition(config, desc, 0, marker=epoch_marker(epoch)):
            now = time.time_ns() // 1000
            arrivals.append((batch.column(0).to_numpy(), now - batch.column(1).to_numpy()))
        epoch += 1


def hop(spark, rate: int, args, tag: str) -> dict:
    base = ExchangeConfig.load().replace(num_subpartitions=1, partitioner="rebalance", buffer_timeout=0.001)
    a, b = f"a{tag}", f"b{tag}"
    spark.conf.set("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
    query = None
    go = threading.Event()
    stop = threading.Event()
    arrivals: list = []
    result: dict = {}
    writer = threading.Thread(target=lambda: result.setdefault("rows", produce(base.replace(exchange=a), rate,
                                                                                  args.seconds + args.warmup_seconds,
                                                                                  go)))
    writer.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the stream is declared by the producer's first call
            try:
                st.describe_stream(base.replace(exchange=a, declare_timeout=1.0))
                break
            except Exception:  # noqa: BLE001
                continue
        query = (spark.readStream.format("pipelined").option("exchange", a).load()
                 .writeStream.format("pipelined").option("exchange", b).option("numSubpartitions", 1)
                 .option("partitioner", "rebalance").option("_asyncProgressTrackingOverrideSinkSupportCheck", "true")
                 .outputMode("update").option("checkpointLocation", str(TMP / f"ck-{tag}"))
                 .trigger(realTime=args.batch).start())
        reader = threading.Thread(target=consume, args=(base, b, arrivals, stop, go), daemon=True)
        reader.start()
        writer.join()
        total = result["rows"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sum(len(i) for i, _ in arrivals) < total:
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
    finally:
        stop.set()
        if query is not None:
            query.stop()
    ids = np.concatenate([i for i, _ in arrivals]) if arrivals else np.array([], dtype=np.int64)
    lat = np.concatenate([x for _, x in arrivals]) if arrivals else np.array([], dtype=np.int64)
    assert len(ids) == total and len(np.unique(ids)) == total, f"{len(ids)} rows arrived of {total}"
    keep = ids >= int(rate * args.warmup_seconds)
    ms = lat[keep] / 1000.0
    return {"rate": rate, "rows": int(keep.sum()), "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "p999_ms": round(float(np.percentile(ms, 99.9)), 2),
            "max_ms": round(float(ms.max()), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-seconds", type=float, default=5.0)
    parser.add_argument("--batch", default="30 seconds", help="the Real-time Mode trigger's duration")
    args = parser.parse_args()
    resolve(ExchangeConfig.load())  # the embedded service, started by this driver process
    spark = (SparkSession.builder.master("local[2]").appName("rtm-hop").config("spark.jars", str(JAR))
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    for i, rate in enumerate(int(r) for r in args.rates.split(",")):
        results.append(hop(spark, rate, args, str(i)))
        print(json.dumps(results[-1]), flush=True)
    (Path(__file__).parent / "rtm-hop-latest.json").write_text(json.dumps(results, indent=1))
    spark.stop()


if __name__ == "__main__":
    main()
