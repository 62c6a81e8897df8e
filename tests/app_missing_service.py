"""A local-cluster application for tests/test_missing_service.py whose one worker host runs no exchange service
(spark-defaults.conf names a coordinator of the operator's): the executor cannot start. Once the test creates the
file argv[1], it plans a read through the jar (the first use of an exchange) and exits."""
import os
import sys
import time

from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local-cluster[1,1,1024]").appName("missing-service").getOrCreate()
go = sys.argv[1]
deadline = time.monotonic() + 600
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.2)
try:
    spark.read.format("pipelined").option("exchange", "never_declared").option("declareTimeout", "1").load()
except Exception:  # noqa: BLE001 - nobody declared it: the point is what was said first
    pass
print("planned", flush=True)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
