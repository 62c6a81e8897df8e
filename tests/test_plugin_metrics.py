"""Exchange metrics where Spark's operators look: the plugin's gauges in Spark's metrics system, read
through the driver's Prometheus servlet during a real application (local mode: the executor's plugin
registers in the driver's metrics system). Builds the plugin jar; ~30-60 s."""
from __future__ import annotations

import pytest
from conftest import run_app_with_jar

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


APP = r'''
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
