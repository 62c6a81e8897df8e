"""Spark benchmark: 10 million rows hash-exchanged to 8 subpartitions, beside baselines in the same session.

Rows: long id, long key, a 16-character string, a double. Measured (best of --repeat runs after a warm-up):

* floor: a no-op Arrow sink (a Python data source writer that discards) plus a reader that yields
  prepared Arrow batches: the cost of moving the rows through Python data sources at all;
* parquet: write to local disk, read, ``repartition(8, "key")``;
* spark: Spark's own ``repartition(8, "key")`` (its shuffle);
* pipelined HYBRID: written, then read;
* pipelined PIPELINED_BOUNDED: read while written (the reader starts first, in another thread).

Every measured action ends in ``write.format("noop")`` so all rows flow. The session is local[10]
on this 2-core machine: a pipelined read and its write need slots at once (2 writers + 8 readers).
Run: .venv/bin/python benchmarks/spark_exchange.py [--rows 10000000] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARKFLOW_EXCHANGE_RUNTIME_DIR", tempfile.mkdtemp(prefix="sparkflow-bench-rt-"))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

N_SUB = 8


class NoopArrowSink(DataSource):
    """The floor's writer: receives every Arrow batch and drops it."""

    @classmethod
    def name(cls) -> str:
        return "floor_sink"

    def writer(self, schema, overwrite):
        return _NoopWriter()


class _NoopWriter(DataSourceArrowWriter):
    def write(self, iterator):
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages):
        pass


_PREPARED: dict = {}


class PreparedBatches(DataSource):
    """The floor's reader: yields Arrow batches prepared once per worker (same rows as the exchange)."""

    @classmethod
    def name(cls) -> str:
        return "floor_source"

    def schema(self):
        return "id long, key long, s string, d double"

    def reader(self, schema):
        return _PreparedReader(int(self.options["rows"]))


class _Split(InputPartition):
    def __init__(self, index: int) -> None:
        self.index = index


class _PreparedReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self):
        return [_Split(i) for i in range(N_SUB)]

    def read(self, partition):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        key = (self.rows, partition.index)
        if key not in _PREPARED:
            per = self.rows // N_SUB
            ids = np.arange(partition.index * per, (partition.index + 1) * per, dtype=np.int64)
            table = pa.table({
                "id": ids, "key": ids % 100_003,
                "s": pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 16, "x"),
                "d": np.random.default_rng(partition.index).random(len(ids)),
            })
            _PREPARED[key] = table.to_batches(max_chunksize=10_000)
        yield from _PREPARED[key]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "spark_exchange-latest.json"))
    args = parser.parse_args()

    spark = (SparkSession.builder.master("local[10]").appName("sparkflow-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(N_SUB))
             .config("spark.sql.adaptive.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NoopArrowSink)
    spark.dataSource.register(PreparedBatches)
    df = spark.range(0, args.rows, 1, 2).selectExpr(
        "id", "id % 100003 AS key", "lpad(CAST(id AS STRING), 16, 'x') AS s", "rand(7) AS d")
    tmp = Path(tempfile.mkdtemp(prefix="sparkflow-bench-parquet-"))

    def noop(frame) -> None:
        frame.write.format("noop").mode("overwrite").save()

    def floor() -> None:
        df.write.format("floor_sink").mode("append").save()
        noop(spark.read.format("floor_source").option("rows", str(args.rows)).load())

    def parquet() -> None:
        df.write.mode("overwrite").parquet(str(tmp / "p"))
        noop(spark.read.parquet(str(tmp / "p")).repartition(N_SUB, "key"))

    def spark_shuffle() -> None:
        noop(df.repartition(N_SUB, "key"))

    def write_exchange(name: str, partition_type: str) -> None:
        (df.write.format("pipelined").mode("overwrite").option("exchange", name).option("partitioner", "hash")
           .option("keys", "key").option("numSubpartitions", str(N_SUB)).option("partitionType", partition_type)
           .save())

    def read_exchange(name: str) -> None:
        noop(spark.read.format("pipelined").option("exchange", name).option("declareTimeout", "120s").load())

    def hybrid() -> None:
        write_exchange("bench-hybrid", "HYBRID")
        read_exchange("bench-hybrid")

    counter = [0]

    def pipelined() -> None:
        counter[0] += 1
        name = f"bench-pipelined-{counter[0]}"
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                read_exchange(name)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.05)  # let the reader thread start planning; it waits for the declaration
        write_exchange(name, "PIPELINED_BOUNDED")
        t.join()
        if errors:
            raise errors[0]

    cases = {"floor": floor, "parquet": parquet, "spark repartition": spark_shuffle,
             "pipelined HYBRID (write, then read)": hybrid,
             "pipelined PIPELINED_BOUNDED (read while written)": pipelined}
    for fn in cases.values():  # warm-up: workers, imports, the embedded service, prepared batches
        fn()
    best = {label: min(timed(fn) for _ in range(args.repeat)) for label, fn in cases.items()}
    spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)

    ratios = {
        "HYBRID / parquet (target <= 1.1)": best["pipelined HYBRID (write, then read)"] / best["parquet"],
        "HYBRID / floor (target <= 1.3)": best["pipelined HYBRID (write, then read)"] / best["floor"],
        "PIPELINED_BOUNDED / parquet (target <= 0.9)":
            best["pipelined PIPELINED_BOUNDED (read while written)"] / best["parquet"],
        "HYBRID / spark repartition": best["pipelined HYBRID (write, then read)"] / best["spark repartition"],
    }
    print(f"{args.rows:,} rows, hash to {N_SUB} subpartitions, best of {args.repeat}")
    for label, secs in best.items():
        print(f"  {label:52s} {secs:7.2f} s")
    for label, ratio in ratios.items():
        print(f"  {label:52s} {ratio:7.2f}")
    Path(args.out).write_text(json.dumps({"rows": args.rows, "date": time.strftime("%Y-%m-%d %H:%M"),
                                          "seconds": best, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
