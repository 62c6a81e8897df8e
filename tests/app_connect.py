"""A Spark Connect client application for tests/test_connect.py (``remote("local[4]")``).

Runs the main examples over Connect and prints one JSON object of what it saw: a hash exchange
written and read (compared with chispa), ``sparkflow_exchange.write`` / ``drop_exchange`` /
``list_exchanges`` / ``register``, the quickstart, and the Arrow setting left as it was.
Its own process: Connect's local server is a JVM of its own, and the tests' classic session lives
in the pytest process.
"""
import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from chispa import assert_df_equality  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import sparkflow_exchange  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
out: dict = {}


def check(name):
    def run(fn):
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - reported, asserted on by the test
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:3000], "trace": traceback.format_exc()[-3000:]}
        return fn
    return run


spark = SparkSession.builder.remote("local[4]").config("spark.sql.session.timeZone", "UTC").getOrCreate()
out["session"] = type(spark).__module__
df = spark.range(0, 5000, 1, 3).selectExpr("id", "CAST(id % 13 AS INT) AS k", "concat('v', CAST(id AS STRING)) AS s")


@check("hash")
def _():
    (df.write.format("pipelined").mode("overwrite").option("exchange", "c-hash").option("keys", "k")
       .option("numSubpartitions", "4").save())
    got = spark.read.format("pipelined").option("exchange", "c-hash").load()
    assert_df_equality(df, got, ignore_row_order=True)
    # each read partition is the subpartition Spark's own repartition(4, k) gives those rows
    placed = got.select("k", F.spark_partition_id().alias("p")).distinct()
    wrong = placed.where(F.expr("pmod(hash(k), 4)") != F.col("p")).count()
    return {"equal": True, "partitions": placed.select("p").distinct().count(), "misplaced": wrong}


@check("helpers")
def _():
    arrow_key = "spark.sql.execution.arrow.maxBytesPerBatch"
    before = spark.conf.get(arrow_key)
    sparkflow_exchange.write(df, "c-forward", partitioner="forward")  # no numSubpartitions: the producers' count
    sparkflow_exchange.write(df, "c-helper", keys="k", numSubpartitions=3)
    fwd = spark.read.format("pipelined").option("exchange", "c-forward").load()
    assert_df_equality(df, fwd, ignore_row_order=True)
    assert_df_equality(df, spark.read.format("pipelined").option("exchange", "c-helper").load(), ignore_row_order=True)
    names = sorted(e.name for e in sparkflow_exchange.list_exchanges(spark))
    dropped = sparkflow_exchange.drop_exchange("c-helper", spark=spark)
    after = sorted(e.name for e in sparkflow_exchange.list_exchanges())
    return {"names": names, "dropped": dropped, "after": after, "forward_partitions": fwd.select(
        F.spark_partition_id()).distinct().count(), "arrow_setting_kept": spark.conf.get(arrow_key) == before}


@check("session_settings")
def _():
    spark.conf.set("spark.sparkflow.exchange.declareTimeout", "2")
    sparkflow_exchange.register(spark)
    start = time.monotonic()
    try:
        _ = spark.read.format("pipelined").option("exchange", "c-missing").load().columns
        error = ""
    except Exception as exc:  # noqa: BLE001
        error = str(exc)
    took = time.monotonic() - start
    spark.conf.unset("spark.sparkflow.exchange.declareTimeout")
    sparkflow_exchange.register(spark)
    return {"error": error[:2000], "took": took}


@check("quickstart")
def _():
    os.environ["SPARK_REMOTE"] = "local[4]"  # the quickstart's own getOrCreate() joins this Connect session
    proc_out = []
    import builtins
    real_print = builtins.print
    builtins.print = lambda *a, **k: proc_out.append(" ".join(map(str, a)))
    try:
        runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    finally:
        builtins.print = real_print
    return {"lines": proc_out[-5:]}  # the quickstart stops the session last


print(json.dumps(out), flush=True)
