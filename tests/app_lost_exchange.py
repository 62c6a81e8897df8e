"""A separate Spark application for tests/test_lost_exchange.py: the embedded service dies after a write.

Writes an exchange through the embedded service (its own runtime dir, so the service is this app's),
kills that service (SIGKILL, by the pid in its state file), then reads the exchange and prints how the
read failed and how long it took, as JSON.
"""
import json
import os
import signal
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

from sparkflow_exchange.service.discovery import runtime_dir  # noqa: E402

spark = SparkSession.builder.master("local[2]").appName("lost-exchange").config("spark.ui.enabled", "false").getOrCreate()
(spark.range(0, 100, 1, 2).write.format("pipelined").mode("overwrite").option("exchange", "doomed")
   .option("keys", "id").option("numSubpartitions", "2").save())
victim = json.loads((runtime_dir() / "embedded.json").read_text())["pid"]
os.kill(victim, signal.SIGKILL)


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (the service may be the child of the Spark planning worker that
    started it, which reaps it only when Spark ends that worker, a minute later)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


deadline = time.monotonic() + 60
while not gone(victim) and time.monotonic() < deadline:
    time.sleep(0.05)
assert gone(victim), f"the killed service {victim} still runs"
start = time.monotonic()
error = ""
try:
    spark.read.format("pipelined").option("exchange", "doomed").option("declareTimeout", "900").load().collect()
except Exception as exc:  # noqa: BLE001 - the point is its text
    error = str(exc)
print(json.dumps({"victim": victim, "error": error, "failed_after": time.monotonic() - start}), flush=True)
spark.stop()
