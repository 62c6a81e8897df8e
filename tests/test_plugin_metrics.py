"""Exchange metrics where Spark's operators look: the plugin's gauges in Spark's metrics system, read
through the driver's Prometheus servlet during a real application (local mode: the executor's plugin
registers in the driver's metrics system). Builds the plugin jar; ~30-60 s."""
from __future__ import annotations

import pytest
from conftest import run_app_with_jar

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


# a local application with the plugin and the driver's Prometheus servlet (the jar's path is argv[1])
SESSION = r'''
import json, re, sys, urllib.request
import sparkflow_exchange
from pyspark.sql import SparkSession
jar = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("plugin-metrics")
         .config("spark.jars", jar).config("spark.plugins", "org.sparkflow.exchange.ExchangePlugin")
         .config("spark.pyspark.python", sys.executable)
         .config("spark.ui.enabled", "true").config("spark.ui.port", "0")
         .config("spark.ui.prometheus.enabled", "true")
         .config("spark.metrics.conf.*.sink.prometheusServlet.class", "org.apache.spark.metrics.sink.PrometheusServlet")
         .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
         .getOrCreate())
'''

APP = SESSION + r'''
spark.range(0, 20000, 1, 2).write.format("pipelined").mode("overwrite").option("exchange", "metered") \
    .option("keys", "id").option("numSubpartitions", "2").save()
scrape = urllib.request.urlopen(spark.sparkContext.uiWebUrl + "/metrics/prometheus", timeout=60).read().decode()
ours = {}
for line in scrape.splitlines():
    m = re.match(r"metrics_(?:\S*_)?plugin_org_sparkflow_exchange_ExchangePlugin_(\w+?)_Value\S* (\S+)$", line)
    if m:
        ours[m.group(1)] = float(m.group(2))
rows = spark.read.format("pipelined").option("exchange", "metered").load().count()
sparkflow_exchange.drop_exchange("metered", spark=spark)
print(json.dumps({"ours": ours, "rows": rows}))
spark.stop()
'''


def test_the_drivers_prometheus_servlet_lists_the_exchange_metrics(tmp_path, jar):
    result, proc = run_app_with_jar(tmp_path, APP, jar)
    ours = result["ours"]
    expected = {"numBytesOut", "numBuffersOut", "numBytesIn", "numBuffersIn", "backPressuredTimeMsPerSecond",
                "spilledBytes", "outPoolUsage", "memoryUsedBytes", "memoryBudgetBytes", "exchangesHeld",
                "exchanges"}
    assert expected <= set(ours), ours
    # the exchange is held when scraped: its partitions' bytes and the coordinator's count show it
    assert ours["numBytesOut"] > 0 and ours["numBuffersOut"] >= 2, ours
    assert ours["exchangesHeld"] == 1 and ours["exchanges"] == 1, ours
    assert ours["memoryBudgetBytes"] > 0, ours
    assert result["rows"] == 20000


DURING = SESSION + r'''
import os, tempfile, threading, time
marker = os.path.join(tempfile.mkdtemp(), "go-on")

def held(batches):  # Spark's partition 1 writes nothing until the marker exists: the write is still running
    from pyspark import TaskContext
    if TaskContext.get().partitionId() == 1:
        deadline = time.monotonic() + 600
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
    yield from batches

def write():
    spark._jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(spark._jsparkSession)
    (spark.range(0, 40000, 1, 2).mapInArrow(held, "id long").write.format("pipelined").mode("overwrite")
       .option("exchange", "metered-live").option("keys", "id").option("numSubpartitions", "2").save())

def ours(path):
    text = urllib.request.urlopen(spark.sparkContext.uiWebUrl + path, timeout=60).read().decode()
    found = {}
    for line in text.splitlines():
        m = re.match(r"metrics_(?:\S*_)?plugin_org_sparkflow_exchange_ExchangePlugin_(\w+?)_Value\S* (\S+)$", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found, text

job = threading.Thread(target=write, daemon=True)
job.start()
deadline = time.monotonic() + 600  # the gauges read the service at most every 5 s
seen, _ = ours("/metrics/prometheus")
while seen.get("numBytesOut", 0) <= 0 and time.monotonic() < deadline and job.is_alive():
    time.sleep(1)
    seen, _ = ours("/metrics/prometheus")
running = job.is_alive() and not os.path.exists(marker)
executors, executors_text = ours("/metrics/executors/prometheus")
open(marker, "w").close()
job.join(600)
rows = spark.read.format("pipelined").option("exchange", "metered-live").load().count()
sparkflow_exchange.drop_exchange("metered-live", spark=spark)
print(json.dumps({"during": seen, "running": running, "executors": executors,
                  "executors_endpoint_answered": "metrics_executor_" in executors_text, "rows": rows}))
spark.stop()
'''


def test_the_exchange_metrics_are_listed_during_a_write(tmp_path, jar):
    """Scraped while the write's second task has not written a row (it waits for the app's marker file):
    the driver's Prometheus servlet shows the bytes written so far and the exchange held. Spark's
    /metrics/executors/prometheus lists only Spark's own executor summaries, never a plugin's gauges
    (docs/operations.md says so; this test notices if Spark changes that)."""
    result, proc = run_app_with_jar(tmp_path, DURING, jar)
    during = result["during"]
    assert result["running"], "the scrape came after the write had ended"
    assert during["numBytesOut"] > 0 and during["numBuffersOut"] >= 1, during
    assert during["exchangesHeld"] == 1 and during["exchanges"] == 1, during
    assert result["executors_endpoint_answered"] and result["executors"] == {}, result
    assert result["rows"] == 40000
