"""Quickstart: hash-exchange a DataFrame through the embedded exchange service, then read it back.

Run: .venv/bin/python examples/quickstart.py
"""
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession, functions as F  # noqa: E402

spark = (SparkSession.builder.master("local[4]").appName("sparkflow-quickstart")
         .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")  # faster writes: README, "One Spark setting"
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

orders = spark.range(0, 100_000, 1, 4).selectExpr(
    "id AS order_id", "id % 1000 AS customer_id", "CAST(id % 7 AS STRING) AS region", "rand(42) * 100 AS amount")

(orders.write.format("pipelined")
    .mode("overwrite")                       # overwrite: create or replace the exchange
    .option("exchange", "orders")
    .option("partitioner", "hash")
    .option("keys", "customer_id,region")
    .option("numSubpartitions", "8")
    .save())

read = spark.read.format("pipelined").option("exchange", "orders").load()
print(f"read partitions: {read.rdd.getNumPartitions()}")
per_partition = read.groupBy(F.spark_partition_id().alias("partition")).count().orderBy("partition")
per_partition.show()

misplaced = read.where(F.spark_partition_id() != F.pmod(F.hash("customer_id", "region"), F.lit(8))).count()
total = read.count()
print(f"rows: {total}, placed exactly where repartition(8, customer_id, region) would put them: {misplaced == 0}")
assert total == 100_000 and misplaced == 0

import sparkflow_exchange  # noqa: E402

sparkflow_exchange.drop_exchange("orders")
spark.stop()
print("quickstart OK")
