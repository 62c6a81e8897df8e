"""Quickstart: hash-exchange a DataFrame through the embedded exchange service, then read it back.

Run: .venv/bin/python examples/quickstart.py
Over Spark Connect: SPARK_REMOTE=local[4] .venv/bin/python examples/quickstart.py   (or sc://host:port)
"""
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F

import sparkflow_exchange  # noqa: E402

builder = SparkSession.builder.appName("sparkflow-quickstart")
if "SPARK_REMOTE" not in os.environ:  # with SPARK_REMOTE set, PySpark makes a Spark Connect session instead
    builder = builder.master("local[4]")
spark = sparkflow_exchange.configure(builder).getOrCreate()  # the plugin jar: format("pipelined") runs in the JVM

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
read.explain()  # "BatchScan ... sparkflow-exchange orders [...]": the JVM path; "(Python)": the Python data source
per_partition = read.groupBy(F.spark_partition_id().alias("partition")).count().orderBy("partition")
print(f"read partitions holding rows: {per_partition.count()}")
per_partition.show()

misplaced = read.where(F.spark_partition_id() != F.pmod(F.hash("customer_id", "region"), F.lit(8))).count()
total = read.count()
print(f"rows: {total}, placed exactly where repartition(8, customer_id, region) would put them: {misplaced == 0}")
assert total == 100_000 and misplaced == 0

sparkflow_exchange.drop_exchange("orders")
spark.stop()
print("quickstart OK")
