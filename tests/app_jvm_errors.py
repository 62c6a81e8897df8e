"""A Spark application reading through the plugin jar an exchange whose service was lost, and one nobody declared,
run by tests/test_error_vocabulary.py with the plugin jar as argv[1] (the coordinator and its secret file in the
spark-defaults.conf it is given).

Each read runs inside ``sparkflow_exchange.translate_errors()``; prints one JSON line: read -> the class it raised
(module.name), its message and code, and the text of the PySpark error it came from.
"""
from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

import sparkflow_exchange as sfx

spark = (SparkSession.builder.master("local[1]").appName("jvm-errors")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sparkflow.exchange.jvmFormat", "true")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
reads = {
    "catalog_of_lost": lambda: spark.table("exchange.held").collect(),
    "format_of_missing": lambda: spark.read.format("pipelined").option("exchange", "never_declared")
                                      .option("declareTimeout", "1").load().collect(),
}
out: dict[str, dict] = {}
for name, read in reads.items():
    try:
        with sfx.translate_errors():
            read()
        out[name] = {"raised": None}
    except Exception as exc:  # noqa: BLE001 - the test asserts on what it is
        out[name] = {"raised": f"{type(exc).__module__}.{type(exc).__name__}", "message": str(exc),
                     "code": str(getattr(exc, "code", "")), "spark": str(exc.__cause__)[:6000]}
print(json.dumps(out), flush=True)
spark.stop()
os._exit(0)
