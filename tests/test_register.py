"""``register(spark)`` where the installed package already registered ``format("pipelined")``: Spark prints
no "replaced a statically registered data source" warning, and the session's settings still reach planning."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parent.parent

APP = r'''
import json
import sparkflow_exchange
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
static = spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("pipelined")
sparkflow_exchange.register(spark)  # nothing to carry: the static registration stands
spark.conf.set("spark.sparkflow.exchange.partitionType", "BLOCKING")
sparkflow_exchange.register(spark)  # a session setting: registered again, quietly
spark.range(0, 10, 1, 2).write.format("pipelined").mode("overwrite").option("exchange", "registered") \
    .option("keys", "id").option("numSubpartitions", "2").save()
kind = {e.name: e for e in sparkflow_exchange.list_exchanges(spark)}["registered"].partition_type
rows = spark.read.format("pipelined").option("exchange", "registered").load().count()
sparkflow_exchange.drop_exchange("registered", spark=spark)
print(json.dumps({"static": static, "kind": str(kind), "rows": rows}))
spark.stop()
'''


def test_register_replaces_the_static_registration_without_a_warning(tmp_path):
    app = tmp_path / "app.py"
    app.write_text(APP)
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONF_DIR": str(conf_dir), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    # from the project root: Spark's lookup finds the package's pyspark_pipelined (an editable install too)
    proc = subprocess.run([sys.executable, str(app)], capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["static"] is True, result  # the case this test is about
    assert result["rows"] == 10 and result["kind"].endswith("BLOCKING"), result
    assert "statically registered" not in proc.stderr, proc.stderr[-5000:]
