"""A separate Spark application for tests/test_memory.py: Spark's ordinary width with default settings.

A wide exchange as a user meets it: ``local[2]``, nothing configured but the exchange's name, its
keys and its width. Two exchanges of 200 write tasks x 16 subpartitions are written and stay alive
together (more partitions than a 1 GiB budget has room for at 16 MiB each), then each is
read back and compared with chispa, placement included (``spark_partition_id()`` of every row is the
one Spark's ``repartition(16, k)`` gives it). (1,000 producers x 4 subpartitions are written and read
at the service level, tests/test_memory.py: 1,000 Python write tasks cost Spark ~30 s on 2 CPUs.)
Prints what it saw as JSON on its last line; a mismatch raises (non-zero exit).
"""
import json
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from chispa import assert_df_equality  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import sparkflow_exchange  # noqa: E402

spark = SparkSession.builder.master("local[2]").appName("default-width").config("spark.ui.enabled", "false").getOrCreate()


def rows(n: int, tasks: int):
    return (spark.range(0, n, 1, tasks).withColumn("k", F.col("id") % 997)
            .withColumn("s", F.concat(F.lit("row-"), F.col("id").cast("string"))))


def write(df, name: str, width: int) -> None:
    (df.write.format("pipelined").mode("overwrite").option("exchange", name).option("keys", "k")
     .option("numSubpartitions", str(width)).save())


def check(expected, name: str, width: int) -> int:
    got = spark.read.format("pipelined").option("exchange", name).load()
    assert got.rdd.getNumPartitions() == width, (name, got.rdd.getNumPartitions())
    placed = got.withColumn("pid", F.spark_partition_id())
    assert_df_equality(placed, expected, ignore_row_order=True)
    return placed.count()


def held() -> dict[str, dict]:
    """What the coordinator holds now, per exchange: its producers, width, seal and committed rows."""
    return {e.name: {"producers": e.producers, "width": e.num_subpartitions, "sealed": e.state == "committed",
                     "rows": e.rows} for e in sparkflow_exchange.list_exchanges(spark)}


report: dict = {"exchanges": {}}
start = time.monotonic()
wide = rows(64_000, 200)
names = [f"width-200x16-{i}" for i in range(2)]
for name in names:
    write(wide, name, 16)
report["alive_together"] = held()
expected = wide.repartition(16, "k").withColumn("pid", F.spark_partition_id()).localCheckpoint()
for name in names:
    report["exchanges"][name] = check(expected, name, 16)
for name in names:
    sparkflow_exchange.drop_exchange(name, spark)
report["seconds"] = time.monotonic() - start
print(json.dumps(report, default=str), flush=True)
spark.stop()
