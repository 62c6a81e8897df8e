"""A separate Spark application for tests/test_applications.py: settings from spark-defaults.conf.

Writes one exchange with no per-use options (spark-defaults.conf decides) and one where an option
overrides the file, then prints what the coordinator recorded and where the embedded service lives.
"""
import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

import sparkflow_exchange  # noqa: E402
from sparkflow_exchange.service.discovery import runtime_dir  # noqa: E402

spark = SparkSession.builder.master("local[2]").appName("config-check").getOrCreate()
df = spark.range(0, 100, 1, 2)
df.write.format("pipelined").mode("overwrite").option("exchange", "from-file").option("keys", "id").save()
(df.write.format("pipelined").mode("overwrite").option("exchange", "overridden").option("keys", "id")
   .option("partitionType", "HYBRID").option("numSubpartitions", "5").save())
rows = spark.read.format("pipelined").option("exchange", "from-file").load().count()
exchanges = {e.name: e for e in sparkflow_exchange.list_exchanges()}
state = json.loads((runtime_dir() / "embedded.json").read_text())
print(json.dumps({
    "rows": rows,
    "from_file": [exchanges["from-file"].partition_type, exchanges["from-file"].num_subpartitions],
    "overridden": [exchanges["overridden"].partition_type, exchanges["overridden"].num_subpartitions],
    "service_pid": state["pid"], "spill_dir": state["spill_dir"], "socket": state["unix"],
}), flush=True)
for name in exchanges:  # the embedded service keeps what it holds; dropped, it exits after the application
    sparkflow_exchange.drop_exchange(name)
spark.stop()
