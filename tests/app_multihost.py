"""Applications for tests/test_multihost.py, run on host0 of tests/multihost.py's cluster and configured by
its spark-defaults.conf alone (master, coordinator, secret file, TLS).

``write PREFIX``: writes a hash, a broadcast and a forward exchange from four tasks spread over both
workers (the hash one through the jar's JVM writer, which ``format("pipelined")`` takes with TLS on too), and
the hash rows again through the catalog (``writeTo``: the JVM writer only), and ends; prints, per exchange,
where its producers' partitions are held.
``read PREFIX``: reads the three and compares them, partition ids included, with what they must hold
(chispa); prints the row and partition counts and each partition's rows and sum of ids, and the names
``list_exchanges(spark)`` gives on the driver; reads the catalog's exchange with ``spark.table`` (compared the
same way) and prints the executed plans of a ``groupBy`` on the key after the JVM reads.

Without Spark (the client API, in a plain Python process of host0, configured by the same file):
``client-sums PREFIX``: each subpartition's rows and sum of ids, as ``read`` prints them.
``client-read-failing PREFIX BOUND``: reads the hash exchange expecting it to fail, no wait of its own
longer than BOUND; prints the error and how long the read took to fail.
"""
import json
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

WIDTH = 4  # write tasks, and read partitions of every exchange
CATALOG = "org.sparkflow.exchange.catalog.ExchangeCatalog"


def source(spark, name: str):
    """The rows each exchange is written from (the same in every application)."""
    n = {"hash": 20_000, "broadcast": 1_000, "forward": 8_000}[name]  # every row is compared in the driver (chispa)
    return spark.range(0, n, 1, WIDTH).selectExpr("id", "CAST(id % 997 AS INT) AS key",
                                                  "concat('v', CAST(id AS STRING)) AS s")


OPTIONS = {
    "hash": {"partitioner": "hash", "keys": "key", "numSubpartitions": str(WIDTH)},
    "broadcast": {"partitioner": "broadcast", "numSubpartitions": str(WIDTH)},
    "forward": {"partitioner": "forward"},
}


def expected(spark, name: str):
    """What a reader's partition ``pid`` must hold: Spark's own hash partitioning, every row in every
    partition, or the producer's rows in its own partition."""
    df = source(spark, name)
    if name == "hash":
        return df.repartition(WIDTH, "key").withColumn("pid", F.spark_partition_id())
    if name == "broadcast":
        return df.crossJoin(spark.range(WIDTH).select(F.col("id").cast("int").alias("pid")))
    return df.withColumn("pid", F.spark_partition_id())


def write(spark, prefix: str) -> dict:
    from sparkflow_exchange.client import read_plan

    out = {}
    for name, options in OPTIONS.items():
        w = source(spark, name).write.format("pipelined").mode("overwrite").option("exchange", f"{prefix}-{name}")
        for key, value in options.items():
            w = w.option(key, value)
        w.save()
        plan = read_plan(f"{prefix}-{name}")
        out[name] = sorted({(p["location"]["host_id"], p["location"]["tcp"]) for p in plan.producers})
    spark.conf.set("spark.sql.catalog.exchange", CATALOG)  # the same settings: spark.sparkflow.exchange.*
    source(spark, "hash").writeTo(f"exchange.`{prefix}-cat`").tableProperty("keys", "key") \
        .tableProperty("numSubpartitions", str(WIDTH)).create()
    plan = read_plan(f"{prefix}-cat")
    out["cat"] = sorted({(p["location"]["host_id"], p["location"]["tcp"]) for p in plan.producers})
    return out


def executed(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def read(spark, prefix: str) -> dict:
    from chispa import assert_df_equality

    import sparkflow_exchange

    out = {}
    jvm = {"format_plan": executed(spark.read.format("pipelined").option("exchange", f"{prefix}-hash").load()
                                   .groupBy("key").count())}
    spark.conf.set("spark.sql.catalog.exchange", CATALOG)
    # partition i = subpartition i, to compare partition ids (readPartitions=auto groups them by size, which
    # compression makes smaller)
    cat = spark.read.option("readPartitions", str(WIDTH)).table(f"exchange.`{prefix}-cat`")
    jvm["catalog_plan"] = executed(cat.groupBy("key").count())
    assert_df_equality(expected(spark, "hash"), cat.withColumn("pid", F.spark_partition_id()), ignore_row_order=True,
                       ignore_nullable=True)
    jvm["catalog_rows"] = cat.count()
    for name in OPTIONS:
        got = spark.read.format("pipelined").option("exchange", f"{prefix}-{name}").load()
        partitions = got.rdd.getNumPartitions()
        got = got.withColumn("pid", F.spark_partition_id()).cache()  # read once, checked three ways
        assert_df_equality(expected(spark, name), got, ignore_row_order=True, ignore_nullable=True)
        sums = {str(r["pid"]): [r["rows"], r["ids"]]
                for r in got.groupBy("pid").agg(F.count("*").alias("rows"), F.sum("id").alias("ids")).collect()}
        out[name] = {"rows": got.count(), "partitions": partitions, "sums": sums}
        got.unpersist()
    # the driver sees the cluster's exchanges (the coordinator spark-defaults.conf names)
    listed = sorted(s.name for s in sparkflow_exchange.list_exchanges(spark) if s.name.startswith(f"{prefix}-"))
    return {"exchanges": out, "listed": listed, "jvm": jvm}


def client_sums(prefix: str) -> dict:
    import pyarrow.compute as pc

    from sparkflow_exchange.client import open_reader, read_plan

    out = {}
    for name in OPTIONS:
        sums = {}
        for sub in range(read_plan(f"{prefix}-{name}").num_subpartitions):
            rows = ids = 0
            with open_reader(f"{prefix}-{name}", subpartitions=sub) as reader:
                for batch in reader:
                    rows += batch.num_rows
                    ids += pc.sum(batch.column("id")).as_py() or 0
            sums[str(sub)] = [rows, ids]
        out[name] = sums
    return out


def client_read_failing(prefix: str, bound: str) -> dict:
    """No wait of the read's own may outlast ``bound`` (readerTimeout, producerTimeout): its failure comes
    from what it found, or at the latest after the bound."""
    from sparkflow_exchange.client import open_reader

    started = time.monotonic()
    rows = 0
    try:
        with open_reader(f"{prefix}-hash", readerTimeout=bound, producerTimeout=bound) as reader:
            for batch in reader:
                rows += batch.num_rows
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        return {"error": f"{type(exc).__name__}: {exc}"[-6000:], "seconds": time.monotonic() - started}
    return {"rows": rows, "seconds": time.monotonic() - started}


def main(mode: str, prefix: str, *args: str) -> None:
    clients = {"client-sums": client_sums, "client-read-failing": client_read_failing}
    if mode in clients:
        print(json.dumps(clients[mode](prefix, *args)), flush=True)
        return
    spark = SparkSession.builder.appName(f"multihost-{mode}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = {"write": write, "read": read}[mode](spark, prefix, *args)
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
