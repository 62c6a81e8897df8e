"""A Spark application reading exchanges through the JVM catalog (``ExchangeCatalog``), run by
tests/test_jvm_catalog.py with the plugin jar as argv[1].

It writes exchanges with the Python data source and the same rows as parquet, then runs the checks of the groups
named by $JVM_CATALOG_CHECKS, comma-separated, all by default ("plans": plans, partitions, sizes; "layouts": other
layouts and types; "failures": drops, damaged files, remote reads, secrets; one application for all saves a session
start per group) and prints
one JSON line: check name -> {"ok": bool, "error": text, ...details}. A check compares the catalog's answer
with parquet's (chispa) or with the Python reader's, and records the plans it looked at.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from decimal import Decimal

from app_checks import check as run_check
from app_checks import results
from chispa import assert_df_equality
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.exchange import list_exchanges as coordinator_records
from sparkflow_exchange.partition.spill import read_index

N = 3000
GROUPS = set(os.environ.get("JVM_CATALOG_CHECKS", "plans,layouts,failures").split(","))
def check(group: str):
    """Run one check of ``group`` (when that group runs) as ``app_checks.check`` runs it."""
    def run(fn):
        return run_check(fn) if group in GROUPS else fn
    return run


def plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def as_int(value) -> int:
    """A Scala BigInt (py4j hands some over as Python ints already)."""
    return value if isinstance(value, int) else int(value.toString())


def shuffles(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if "Exchange" in line]


def same(actual, expected) -> None:
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_column_order=True, ignore_nullable=True)


spark = (SparkSession.builder.master("local[2]").appName("jvm-catalog")
         .config("spark.jars", sys.argv[1])
         .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog")
         .config("spark.sparkflow.exchange.jvmFormat", "false")  # format("pipelined") is the Python path compared with
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.autoBroadcastJoinThreshold", "-1")  # joins must be planned as joins, not broadcasts
         .config("spark.sql.adaptive.enabled", "false")  # plans as planned: no coalescing after the fact
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
warehouse = tempfile.mkdtemp(prefix="jvm-catalog-parquet-")

base = spark.range(N).select(
    (F.col("id") % 97).alias("k"), (F.col("id") % 5).alias("j"), F.col("id").alias("v"),
    F.concat(F.lit("s"), F.col("id").cast("string")).alias("s"))


def write(df, name: str, keys: str | None, n: int | None, partitioner: str = "hash") -> None:
    w = df.write.format("pipelined").mode("overwrite").option("exchange", name).option("partitioner", partitioner)
    if keys:
        w = w.option("keys", keys)
    if n is not None:
        w = w.option("numSubpartitions", str(n))
    w.save()
    df.write.mode("overwrite").parquet(os.path.join(warehouse, name))


def parquet(name: str):
    return spark.read.parquet(os.path.join(warehouse, name))


def described(name: str) -> dict:
    """The coordinator's record of the exchange (its producers' spill files, its sizes)."""
    return next(e for e in coordinator_records(ExchangeConfig.load()) if e["name"] == name)


write(base, "t8a", "k", 8)
if GROUPS & {"plans", "layouts"}:
    write(base.withColumn("v", F.col("v") * 2), "t8b", "k", 8)
if "layouts" in GROUPS:
    write(base.withColumn("v", F.col("v") + 1), "t4", "k", 4)
    write(base, "two_keys", "k,j", 8)
    write(base, "coalesced", "k", None)


@check("plans")
def tables(d):
    names = sorted(r.tableName for r in spark.sql("SHOW TABLES IN exchange").collect())
    d["names"] = names
    assert {"t8a", "t8b"} <= set(names), names


@check("plans")
def group_by_key(d):
    got = spark.table("exchange.t8a").groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n"))
    d["plan"] = plan(got)
    d["shuffles"] = shuffles(d["plan"])
    assert not d["shuffles"], d["plan"]
    same(got, parquet("t8a").groupBy("k").agg(F.sum("v").alias("sv"), F.count("*").alias("n")))


@check("plans")
def join_same_width(d):
    got = spark.table("exchange.t8a").join(spark.table("exchange.t8b").withColumnRenamed("v", "w")
                                           .drop("s", "j"), "k")
    d["plan"] = plan(got)
    d["shuffles"] = shuffles(d["plan"])
    assert not d["shuffles"], d["plan"]
    want = parquet("t8a").join(parquet("t8b").withColumnRenamed("v", "w").drop("s", "j"), "k")
    same(got, want)
    d["rows"] = got.count()


@check("plans")
def sql_select(d):
    got = spark.sql("SELECT k, count(*) AS n, max(s) AS top FROM exchange.t8a WHERE v % 3 = 0 GROUP BY k")
    d["plan"] = plan(got)
    assert not shuffles(d["plan"]), d["plan"]
    parquet("t8a").createOrReplaceTempView("t8a_parquet")
    same(got, spark.sql("SELECT k, count(*) AS n, max(s) AS top FROM t8a_parquet WHERE v % 3 = 0 GROUP BY k"))


@check("plans")
def partition_ids(d):
    """readPartitions=n: partition i holds subpartition i, the Python reader's partitions and Spark's own hash
    placement."""
    pid = F.spark_partition_id().alias("pid")
    exact = spark.read.option("readPartitions", "8").table("exchange.t8a")
    jvm = exact.select(pid, "k", "j", "v", "s")
    python = spark.read.format("pipelined").option("exchange", "t8a").load().select(pid, "k", "j", "v", "s")
    same(jvm, python)
    wrong = jvm.where(F.col("pid") != F.expr("pmod(hash(k), 8)")).count()
    assert wrong == 0, f"{wrong} rows outside pmod(hash(k), 8)"
    d["partitions"] = exact.rdd.getNumPartitions()
    assert d["partitions"] == 8


@check("plans")
def grouped_read_partitions(d):
    """By default a small exchange is read in fewer partitions than subpartitions, as adaptive execution
    coalesces a shuffle (without it, one per subpartition); read partition j holds the subpartitions j, j + m, ..., so its rows are bucket(m, k) = j
    and groupBy(k) still needs no shuffle. The same for every divisor asked for; a non-divisor is refused."""
    pid = F.spark_partition_id().alias("pid")
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        d["default_partitions"] = spark.table("exchange.t8a").rdd.getNumPartitions()
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", "false")
    assert d["default_partitions"] < 8, d
    d["without_adaptive_execution"] = spark.table("exchange.t8a").rdd.getNumPartitions()
    assert d["without_adaptive_execution"] == 8, d
    for m in (d["default_partitions"], 2, 4):
        got = spark.read.option("readPartitions", str(m)).table("exchange.t8a")
        assert got.rdd.getNumPartitions() == m, (m, got.rdd.getNumPartitions())
        placed = got.select(pid, "k", "j", "v", "s")
        wrong = placed.where(F.col("pid") != F.expr(f"pmod(hash(k), {m})")).count()
        assert wrong == 0, f"{wrong} rows outside pmod(hash(k), {m})"
        same(got, parquet("t8a"))
        grouped = got.groupBy("k").agg(F.sum("v").alias("sv"))
        assert not shuffles(plan(grouped)), plan(grouped)
        same(grouped, parquet("t8a").groupBy("k").agg(F.sum("v").alias("sv")))
    try:
        spark.read.option("readPartitions", "3").table("exchange.t8a").count()
        raise AssertionError("readPartitions=3 of 8 subpartitions was accepted")
    except Exception as exc:  # noqa: BLE001 - the message is the check
        d["refused"] = str(exc)[:600]
    assert "readPartitions=3 for exchange 't8a' of 8 subpartitions: give a divisor of 8" in d["refused"], d


@check("plans")
def key_filters_prune_subpartitions(d):
    """An equality or IN filter on the hash key reads only the subpartitions its values hash to; the answers
    stay those of parquet, for keys present and absent."""
    t = spark.table("exchange.t8a")
    keys = [r["k"] for r in parquet("t8a").select("k").distinct().limit(2).collect()]
    for cond in (F.col("k") == keys[0], F.col("k").isin(*keys), F.col("k").isin(keys[0], -987654321)):
        got = t.where(cond)
        d.setdefault("plans", []).append(plan(got))
        read = {int(x) for x in re.findall(r"subpartitions \((\d+) read\)", plan(got))}
        assert read and max(read) <= 2, plan(got)
        same(got, parquet("t8a").where(cond))
    unpruned = t.where(F.col("v") == 5)
    assert "read)" not in plan(unpruned), plan(unpruned)
    same(unpruned, parquet("t8a").where(F.col("v") == 5))


@check("layouts")
def two_keys(d):
    """Hashed on (k, j): partitions exact, no partitioning claimed (Spark takes one bucket column), answers right;
    a filter on both keys prunes, one on k alone cannot."""
    pid = F.spark_partition_id().alias("pid")
    jvm = spark.read.option("readPartitions", "8").table("exchange.two_keys")
    both = (F.col("k") == 3) & F.col("j").isin(1, 2)
    d["pruned_plan"] = plan(jvm.where(both))
    assert re.findall(r"subpartitions \((\d+) read\)", d["pruned_plan"]) in (["1"], ["2"]), d["pruned_plan"]
    same(jvm.where(both), parquet("two_keys").where(both))
    assert "read)" not in plan(jvm.where(F.col("k") == 3))
    same(jvm.where(F.col("k") == 3), parquet("two_keys").where(F.col("k") == 3))
    same(jvm.select(pid, "k", "j", "v", "s"),
         spark.read.format("pipelined").option("exchange", "two_keys").load().select(pid, "k", "j", "v", "s"))
    got = jvm.groupBy("k", "j").agg(F.sum("v").alias("sv"))
    d["plan"] = plan(got)
    same(got, parquet("two_keys").groupBy("k", "j").agg(F.sum("v").alias("sv")))


@check("layouts")
def different_widths(d):
    got = spark.table("exchange.t8a").join(spark.table("exchange.t4").select("k", F.col("v").alias("w")), "k")
    d["plan"] = plan(got)
    same(got, parquet("t8a").join(parquet("t4").select("k", F.col("v").alias("w")), "k"))


@check("layouts")
def different_read_partitions_reduce_to_a_common_divisor(d):
    """Two exchanges of width 8 read in 4 and 2 partitions: bucket(4, k) and bucket(2, k) reduce to bucket(2, k)
    under allowCompatibleTransforms, so the join shuffles neither side, and the answer is parquet's."""
    spark.conf.set("spark.sql.sources.v2.bucketing.allowCompatibleTransforms.enabled", "true")
    try:
        left = spark.read.option("readPartitions", "4").table("exchange.t8a")
        right = spark.read.option("readPartitions", "2").table("exchange.t8b").select("k", F.col("v").alias("w"))
        got = left.join(right, "k")
        d["plan"] = plan(got)
        assert not shuffles(d["plan"]), d["plan"]
        same(got, parquet("t8a").join(parquet("t8b").select("k", F.col("v").alias("w")), "k"))
    finally:
        spark.conf.unset("spark.sql.sources.v2.bucketing.allowCompatibleTransforms.enabled")


@check("layouts")
def coalesced_width(d):
    """Written without numSubpartitions: read one partition per subpartition, every row exactly once."""
    got = spark.table("exchange.coalesced")
    d["partitions"] = got.rdd.getNumPartitions()
    d["subpartitions"] = described("coalesced")["num_subpartitions"]
    same(got, parquet("coalesced"))


@check("layouts")
def bucket_function_shuffles_the_other_side(d):
    """With v2.bucketing.shuffle, Spark places the plain side's rows with our bucket function: must equal the writer."""
    spark.conf.set("spark.sql.sources.v2.bucketing.shuffle.enabled", "true")
    try:
        other = parquet("t8b").select("k", F.col("v").alias("w"))
        got = spark.table("exchange.t8a").join(other, "k")
        d["plan"] = plan(got)
        same(got, parquet("t8a").join(other, "k"))
    finally:
        spark.conf.unset("spark.sql.sources.v2.bucketing.shuffle.enabled")


@check("plans")
def statistics_and_pruning(d):
    desc = described("t8a")
    spark.conf.set("spark.sql.cbo.enabled", "true")  # Spark keeps a scan's row count only for its cost-based optimizer
    try:
        stats = spark.table("exchange.t8a")._jdf.queryExecution().optimizedPlan().stats()
        d["rows"] = as_int(stats.rowCount().get())
        d["bytes"] = as_int(stats.sizeInBytes())
    finally:
        spark.conf.unset("spark.sql.cbo.enabled")
    d["exchange_bytes"] = sum(desc["subpartition_bytes"])
    assert d["rows"] == N
    assert d["bytes"] == d["exchange_bytes"], (d["bytes"], d["exchange_bytes"])
    pruned = spark.table("exchange.t8a").select("k", "v")
    scan = next(line for line in plan(pruned).splitlines() if "BatchScan" in line)
    d["scan"] = scan.strip()
    read = re.search(r"BatchScan \S+\[([^\]]*)\]", scan).group(1)
    assert [c.split("#")[0] for c in read.split(", ")] == ["k", "v"], scan
    same(pruned, parquet("t8a").select("k", "v"))


@check("layouts")
def types(d):
    rows = [(i, f"key{i % 13}", i * 1.5, Decimal(i) / 100, i % 2 == 0, bytes([i % 256]), [i, i + 1],
             None if i % 7 == 0 else f"x{i}") for i in range(500)]
    df = spark.createDataFrame(rows, "i int, key string, d double, m decimal(12,2), b boolean, bin binary, "
                                     "arr array<int>, maybe string") \
        .withColumn("day", F.expr("date_add(DATE'2024-01-01', i)")) \
        .withColumn("ts", F.expr("timestamp_seconds(i * 3600)")) \
        .withColumn("st", F.expr("named_struct('x', i, 'y', key, 'inner', named_struct('z', d))"))
    write(df, "typed", "key", 5)
    got = spark.table("exchange.typed")
    same(got, parquet("typed"))
    pid = F.spark_partition_id()
    exact = spark.read.option("readPartitions", "5").table("exchange.typed")
    assert exact.where(pid != F.expr("pmod(hash(key), 5)")).count() == 0
    agg = got.groupBy("key").agg(F.sum("d").alias("sd"))
    d["plan"] = plan(agg)
    assert not shuffles(d["plan"]), d["plan"]
    # a filter on a key of each type prunes to the one subpartition its value hashes to, rows as parquet's
    d["pruned"] = {}
    for key in ("key", "i", "m", "bin", "day", "ts"):  # (b == false is planned as NOT b: no equality)
        write(df, f"typed_{key}", key, 5)
        value = df.where("i = 31").select(key).first()[0]
        got = spark.table(f"exchange.typed_{key}").where(F.col(key) == F.lit(value))
        d["pruned"][key] = re.findall(r"subpartitions \((\d+) read\)", plan(got))
        assert d["pruned"][key] == ["1"], (key, plan(got))
        same(got, parquet(f"typed_{key}").where(F.col(key) == F.lit(value)))


@check("failures")
def drop_table(d):
    write(base, "dropped", "k", 2)
    spark.sql("DROP TABLE exchange.dropped")
    d["left"] = [e["name"] for e in coordinator_records(ExchangeConfig.load())]
    assert "dropped" not in d["left"]
    try:
        spark.table("exchange.dropped").count()
    except Exception as exc:  # noqa: BLE001
        d["error_after_drop"] = str(exc)[:500]
    assert "TABLE_OR_VIEW_NOT_FOUND" in d.get("error_after_drop", ""), d


def flip_first_data_byte(name: str) -> tuple[dict, int]:
    """Damage one byte of the first data buffer of the first committed producer: (producer, subpartition)."""
    desc = described(name)
    producer = next(p for p in desc["producers"] if p["partition"] == desc["committed"][0])
    spill = producer["spill"]
    index = spill[:-5] + ".index" if spill.endswith(".data") else spill.rsplit(".", 1)[0] + ".index"
    for sub in range(desc["num_subpartitions"]):
        data = [e for e in read_index(index, sub) if e[3] == 0]
        if data:
            _seq, offset, length, _kind, _flags = data[0]
            with open(spill, "r+b") as f:
                f.seek(offset + length // 2)
                byte = f.read(1)
                f.seek(offset + length // 2)
                f.write(bytes([byte[0] ^ 0xFF]))
            return producer, sub
    raise AssertionError("no data buffer to damage")


def faraway() -> str:
    """A second catalog that believes it runs on another host: every producer is read from its service (TCP)."""
    spark.conf.set("spark.sql.catalog.faraway", "org.sparkflow.exchange.catalog.ExchangeCatalog")
    spark.conf.set("spark.sql.catalog.faraway.hostId", "another-host")
    return "faraway"


@check("failures")
def remote_read(d):
    """Producers on "another host" are read from their services under credit: the same rows in the same partitions."""
    pid = F.spark_partition_id().alias("pid")
    remote = spark.table(f"{faraway()}.t8a").select(pid, "k", "j", "v", "s")
    same(remote, spark.table("exchange.t8a").select(pid, "k", "j", "v", "s"))
    d["rows"] = remote.count()


@check("failures")
def corrupt_spill_file(d):
    write(base, "damaged", "k", 4)
    producer, sub = flip_first_data_byte("damaged")
    d["expected"] = f"exchange 'damaged', producer {producer['index']} (partition {producer['partition']}), " \
                    f"subpartition {sub}"
    for catalog, key in (("exchange", "message"), (faraway(), "remote_message")):
        try:
            spark.table(f"{catalog}.damaged").collect()
        except Exception as exc:  # noqa: BLE001
            d[key] = str(exc)[:3000]


@check("failures")
def missing_spill_file(d):
    write(base, "vanished", "k", 4)
    desc = described("vanished")
    producer = next(p for p in desc["producers"] if p["partition"] == desc["committed"][0])
    os.unlink(producer["spill"])
    d["producer"] = f"producer {producer['index']} (partition {producer['partition']})"
    try:
        spark.table("exchange.vanished").collect()
    except Exception as exc:  # noqa: BLE001
        d["message"] = str(exc)[:3000]


@check("failures")
def wrong_secret(d):
    embedded = json.loads(open(os.path.join(os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"], "embedded.json")).read())
    d["has_secret"] = bool(embedded.get("secret"))
    spark.conf.set("spark.sql.catalog.strangers", "org.sparkflow.exchange.catalog.ExchangeCatalog")
    spark.conf.set("spark.sql.catalog.strangers.coordinator", embedded["unix"])
    spark.conf.set("spark.sql.catalog.strangers.secret", "not-the-secret")
    try:
        spark.sql("SHOW TABLES IN strangers").collect()
    except Exception as exc:  # noqa: BLE001
        d["message"] = str(exc)[:2000]
    spark.conf.set("spark.sql.catalog.friends", "org.sparkflow.exchange.catalog.ExchangeCatalog")
    spark.conf.set("spark.sql.catalog.friends.coordinator", embedded["unix"])
    spark.conf.set("spark.sql.catalog.friends.secret", embedded.get("secret") or "")
    d["friends_rows"] = spark.table("friends.t8a").count()


if __name__ == "__main__":  # run by itself (tests/app_jvm_write_and_catalog.py runs it as a part)
    print(json.dumps(results))
    spark.stop()
