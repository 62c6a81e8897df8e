"""Broadcast a small dimension table to every consumer partition, then join locally in each.

Run: .venv/bin/python examples/broadcast_dimension.py
"""
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F

import sparkflow_exchange  # noqa: E402

spark = sparkflow_exchange.configure(SparkSession.builder.master("local[4]").appName("sparkflow-broadcast")).getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

regions = spark.createDataFrame([(i, f"region-{i}") for i in range(7)], "region_id long, region_name string")
(regions.write.format("pipelined").mode("overwrite")
    .option("exchange", "regions").option("partitioner", "broadcast").option("numSubpartitions", "4")
    .save())

dim = spark.read.format("pipelined").option("exchange", "regions").load()
per_partition = dim.groupBy(F.spark_partition_id().alias("partition")).count().orderBy("partition").collect()
print("rows per consumer partition:", [(r["partition"], r["count"]) for r in per_partition])
assert [r["count"] for r in per_partition] == [7, 7, 7, 7]

# every partition holds the whole table, so a partition-local join needs no shuffle of the facts
facts = spark.range(0, 40, 1, 4).selectExpr("id", "id % 7 AS region_id")
joined = facts.join(F.broadcast(dim.where(F.spark_partition_id() == 0)), "region_id")
print(f"joined rows: {joined.count()}")

sparkflow_exchange.drop_exchange("regions")
spark.stop()
print("broadcast OK")
