"""A Spark application started without the plugin jar that adds it with ``ADD JAR``, then writes 100,000 rows with
``format("pipelined")`` and reads them back (run by tests/test_jvm_write.py; argv[1] is the jar). The write either
commits every row, read back by the JVM and the Python reader, or fails with a clear error: never an empty commit.
Prints one JSON line."""
from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.exchange import list_exchanges
from sparkflow_exchange.service.discovery import resolve

resolve(ExchangeConfig.load())  # the embedded service, started by this driver process
spark = (SparkSession.builder.master("local[2]").appName("add-jar").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "4").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out: dict = {}
spark.sql(f"ADD JAR {sys.argv[1]}")
df = spark.range(100_000).select((F.col("id") % 97).alias("k"), F.col("id").alias("v"))
try:
    df.write.format("pipelined").mode("overwrite").option("exchange", "added").option("keys", "k") \
        .option("numSubpartitions", "4").save()
    out["written"] = True
except Exception as exc:  # noqa: BLE001 - the test asserts on the message
    out["written"] = False
    out["error"] = str(exc)[:4000]
listed = [e for e in list_exchanges(ExchangeConfig.load()) if e["name"] == "added"]
out["listed"] = [{"state": e.get("state"), "rows": e.get("rows"), "producers": len(e.get("committed") or [])}
                 for e in listed]
if out["written"]:
    out["jvm_rows"] = spark.read.format("pipelined").option("exchange", "added").load().count()
    spark.conf.set("spark.sparkflow.exchange.jvmFormat", "false")
    out["python_rows"] = spark.read.format("pipelined").option("exchange", "added").load().count()
print(json.dumps(out))
spark.stop()
