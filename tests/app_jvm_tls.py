"""A Spark application whose exchange service speaks TLS, run by tests/test_jvm_tls.py with the plugin jar as argv[1]
and the service's addresses, secret and certificates as JSON in argv[2] (the test writes them in place of that
argument).

The session names the service by TCP (coordinator and service settings) with ``tls.caFile``, and a ``hostId`` of
its own, so that its read tasks read the producers over TCP, not from the spill files of their host: every
connection of the JVM writer, reader and catalog is a TLS one. Checks: ``format("pipelined")`` writes and reads
through the JVM path and the catalog writes and reads (``explain()`` shows the exchange's scan and no Exchange after
it for a ``groupBy`` on the key), rows exactly the source's; catalogs given a wrong CA, or a service whose
certificate does not name the address dialled, fail with the verification's words.
Prints one JSON line: check name -> {"ok": bool, "error": text, ...details}.
"""
from __future__ import annotations

import json
import sys

from app_checks import check, results
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

CATALOG = "org.sparkflow.exchange.catalog.ExchangeCatalog"
N = 200_000  # rows: many buffers (and TLS records) on every connection, beyond a reader's first credit of 4
setup = json.loads(sys.argv[2])


def executed(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def grouped_rows(df) -> list[tuple]:
    return sorted(map(tuple, df.groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n")).collect()))


spark = (SparkSession.builder.master("local[2]").appName("jvm-tls")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", CATALOG)
         .config("spark.sql.catalog.wrongca", CATALOG)
         .config("spark.sql.catalog.wrongca.tls.caFile", setup["other_ca"])
         .config("spark.sql.catalog.wrongname", CATALOG)
         .config("spark.sql.catalog.wrongname.coordinator", setup["misnamed_tcp"])
         .config("spark.sql.catalog.wrongname.tls.caFile", setup["misnamed_cert"])
         .config("spark.sql.catalog.trustca", CATALOG)
         .config("spark.sql.catalog.trustca.coordinator", setup["misnamed_tcp"])
         .config("spark.sql.catalog.trustca.tls.caFile", setup["misnamed_cert"])
         .config("spark.sql.catalog.trustca.tls.checkHostname", "false")
         .config("spark.sparkflow.exchange.coordinator", setup["tcp"])
         .config("spark.sparkflow.exchange.service", setup["tcp"])
         .config("spark.sparkflow.exchange.secret", setup["secret"])
         .config("spark.sparkflow.exchange.tls.caFile", setup["ca"])
         .config("spark.sparkflow.exchange.hostId", "jvm-tls-reader")  # not the service's host: reads go over TCP
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.adaptive.enabled", "false")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
base = spark.range(N).select((F.col("id") % 97).alias("k"), F.col("id").alias("v")).cache()
want = grouped_rows(base)


@check
def format_pipelined_over_tls_is_served_by_the_jvm(d):
    base.write.format("pipelined").mode("overwrite").option("exchange", "fmt").option("keys", "k") \
        .option("numSubpartitions", "4").save()
    got = spark.read.format("pipelined").option("exchange", "fmt").load()
    d["plan"] = executed(got.groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n")))
    assert "sparkflow-exchange fmt" in d["plan"] and "(Python)" not in d["plan"], d["plan"]
    assert "Exchange" not in d["plan"].replace("sparkflow-exchange", ""), d["plan"]
    assert got.rdd.getNumPartitions() == 4
    assert grouped_rows(got) == want
    assert sorted(r.v for r in got.select("v").collect()) == list(range(N))


@check
def catalog_over_tls_writes_and_reads_in_the_jvm(d):
    base.writeTo("exchange.cat").tableProperty("keys", "k").tableProperty("numSubpartitions", "4").create()
    got = spark.table("exchange.cat")
    d["plan"] = executed(got.groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n")))
    assert "sparkflow-exchange cat" in d["plan"] and "(Python)" not in d["plan"], d["plan"]
    assert "Exchange" not in d["plan"].replace("sparkflow-exchange", ""), d["plan"]
    assert grouped_rows(got) == want
    d["tables"] = [r.tableName for r in spark.sql("SHOW TABLES IN exchange").collect()]
    assert {"cat", "fmt"} <= set(d["tables"]), d["tables"]
    assert sorted(r.v for r in got.select("v").collect()) == list(range(N))


@check
def a_wrong_ca_fails_verification(d):
    spark.table("wrongca.cat").collect()


@check
def a_certificate_not_naming_the_address_fails_verification(d):
    spark.table("wrongname.anything").collect()


@check
def without_the_host_name_check_the_ca_alone_is_trusted(d):
    d["tables"] = [r.tableName for r in spark.sql("SHOW TABLES IN trustca").collect()]


print(json.dumps(results))
