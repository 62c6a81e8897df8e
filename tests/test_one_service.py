"""One name, one service: without ``register(spark)``, the Python data source behind ``format("pipelined")`` finds
the service the session builder names (``coordinator``, ``secretFile``), as the jar's JVM path does: a Python write
is read by the catalog and a JVM write by the Python reader, both on that service, none on an embedded one; a
stream (the Python source's, behind the jar's provider) too. A real service on loopback and one local application
with the plugin jar; about 60 s."""
from __future__ import annotations

import pytest
from conftest import run_app_with_jar
from harness import client_config

from sparkflow_exchange import exchange as ex

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

APP = r'''
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
spark = (SparkSession.builder.master("local[2]").appName("one-service").config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sparkflow.exchange.coordinator", COORDINATOR)
         .config("spark.sparkflow.exchange.secretFile", SECRET_FILE)
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out = {}
df = spark.range(300).select((F.col("id") % 7).alias("k"), F.col("id").alias("v"))
try:
    spark.conf.set("spark.sparkflow.exchange.jvmFormat", "false")  # the Python data source writes
    df.write.format("pipelined").mode("overwrite").option("exchange", "by_python").option("keys", "k") \
        .option("numSubpartitions", "4").save()
    out["catalog_reads_python_write"] = sorted(r.v for r in spark.table("exchange.by_python").collect())
    spark.conf.set("spark.sparkflow.exchange.jvmFormat", "true")  # the jar writes
    df.write.format("pipelined").mode("overwrite").option("exchange", "by_jvm").option("keys", "k") \
        .option("numSubpartitions", "4").save()
    spark.conf.set("spark.sparkflow.exchange.jvmFormat", "false")
    out["python_reads_jvm_write"] = sorted(r.v for r in spark.read.format("pipelined").option("exchange", "by_jvm")
                                           .load().collect())
    # streaming is the Python source's, behind the jar's provider: it finds the same service
    src = SPARK_DIR + "/src"
    spark.range(50).selectExpr("CAST(id AS STRING) AS value").write.mode("overwrite").text(src)
    texts = spark.readStream.format("text").load(src)
    q = (texts.writeStream.format("pipelined").option("exchange", "streamed").option("keys", "value")
         .option("numSubpartitions", "2").option("checkpointLocation", SPARK_DIR + "/w")
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    r = (spark.readStream.format("pipelined").option("exchange", "streamed").load().writeStream.format("memory")
         .queryName("streamed_rows").option("checkpointLocation", SPARK_DIR + "/r").trigger(availableNow=True).start())
    r.awaitTermination(300)
    out["streamed"] = sorted(int(x.value) for x in spark.table("streamed_rows").collect())
except Exception as exc:  # noqa: BLE001 - the test shows it
    out["error"] = str(exc)[:3000]
print(json.dumps(out))
spark.stop()
'''


def test_the_python_source_and_the_jar_find_the_service_the_builder_names(tmp_path, tmp_service, jar):
    from sparkflow_exchange.service.process import stop_embedded

    svc = tmp_service()
    secret_file = tmp_path / "svc0" / "secret"
    source = APP.replace("COORDINATOR", repr(svc.tcp)).replace("SECRET_FILE", repr(str(secret_file))) \
        .replace("SPARK_DIR", repr(str(tmp_path / "stream")))
    try:
        out, _proc = run_app_with_jar(tmp_path, source, jar, timeout=600)
        embedded = list((tmp_path / "runtime").glob("embedded*.json"))  # before stop_embedded removes it
    finally:
        stop_embedded(tmp_path / "runtime")
    assert "error" not in out, out["error"]
    assert out["catalog_reads_python_write"] == out["python_reads_jvm_write"] == list(range(300))
    names = {e["name"] for e in ex.list_exchanges(client_config(svc))}
    assert {"by_python", "by_jvm"} <= names, names
    assert out["streamed"] == list(range(50)), out["streamed"]
    assert not embedded, "an embedded service was started"
