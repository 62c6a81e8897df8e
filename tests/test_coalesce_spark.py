"""Coalesced reads in Spark: without numSubpartitions the width is spark.sql.shuffle.partitions and a read
of the sealed exchange groups adjacent subpartitions into read partitions of about advisoryPartitionSize."""
from __future__ import annotations

import itertools
import time
from contextlib import contextmanager

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.description import ExchangeDescription

pytestmark = pytest.mark.spark

_names = itertools.count()
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns() % 10**6}"


@contextmanager
def shuffle_partitions(spark, n: int):
    """Spark's default width for the write; the shared session uses 4 (and its checks stay fast with 4)."""
    old = spark.conf.get(SHUFFLE_PARTITIONS)
    spark.conf.set(SHUFFLE_PARTITIONS, str(n))
    try:
        yield
    finally:
        spark.conf.set(SHUFFLE_PARTITIONS, old)


def read(spark, name: str, **options):
    r = spark.read.format("pipelined").option("exchange", name)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def assert_keys_in_one_partition_and_ranges_disjoint(df, width: int) -> None:
    """Each key in exactly one read partition; each read partition one contiguous run of subpartitions."""
    rows = df.select("key", F.spark_partition_id().alias("part"),
                     F.expr(f"pmod(hash(key), {width})").alias("sub")).distinct().collect()
    parts_of_key: dict[int, set[int]] = {}
    subs_of_part: dict[int, set[int]] = {}
    for r in rows:
        parts_of_key.setdefault(r["key"], set()).add(r["part"])
        subs_of_part.setdefault(r["part"], set()).add(r["sub"])
    assert all(len(p) == 1 for p in parts_of_key.values())
    runs = sorted((min(s), max(s)) for s in subs_of_part.values())
    assert all(a[1] < b[0] for a, b in zip(runs, runs[1:])), runs


def test_coalesced_read_under_shuffle_partitions_200(spark):
    name = unique("coalesce")
    df = spark.range(0, 10_000, 1, 4).selectExpr("id", "id % 997 AS key", "repeat('x', 20) AS pad")
    with shuffle_partitions(spark, 200):
        (df.write.format("pipelined").mode("overwrite").option("exchange", name)
           .option("partitioner", "hash").option("keys", "key").save())
    desc = ExchangeDescription.parse([e for e in ex.list_exchanges() if e["name"] == name][0])
    assert desc.num_subpartitions == 200 and desc.coalesce and desc.sealed
    assert sum(desc.subpartition_bytes) > 0

    default = read(spark, name)  # 64m: everything fits one read partition
    assert default.rdd.getNumPartitions() < 10
    assert_df_equality(default, df, ignore_row_order=True, ignore_column_order=False)
    assert_keys_in_one_partition_and_ranges_disjoint(default, 200)

    small = read(spark, name, advisoryPartitionSize="16k")  # a smaller target: more, smaller read partitions
    n_small = small.rdd.getNumPartitions()
    assert default.rdd.getNumPartitions() < n_small < 200
    assert_df_equality(small, df, ignore_row_order=True)
    assert_keys_in_one_partition_and_ranges_disjoint(small, 200)


def test_read_while_written_is_laid_out_to_the_task_slots(spark):
    """An exchange still being written has no final sizes: a read planned then is not coalesced but laid out to
    the reading application's task slots, min(slots, width) read partitions (a coalesced exchange's keys need not
    be bucketed as repartition(m) would, so any number within the width)."""
    name = unique("unsealed")
    config = ExchangeConfig.load({"exchange": name, "partitioner": "hash", "keys": "key"})
    handle = ex.declare_write(config, pa.schema([pa.field("key", pa.int64(), False)]), True)
    task = ex.ProducerTask(handle, 0, "a0", num_subpartitions=6)  # registered, not committed: width known
    assert read(spark, name, taskSlots=4).rdd.getNumPartitions() == 4
    assert read(spark, name, taskSlots=16).rdd.getNumPartitions() == 6
    assert read(spark, name, readPartitions=5).rdd.getNumPartitions() == 5
    task.fail("test over")
    wh.abort_write(handle, "test over")
    ex.drop_exchange(name)


def test_skewed_subpartition_is_split_across_read_tasks_by_producers(spark):
    """splitSkewedSubpartitions: the hot key's subpartition is read by several tasks (each a range of its
    producers); every row still read once, the other keys still one read partition each."""
    name = unique("skew")
    hot = 7
    df = spark.range(0, 40_000, 1, 8).selectExpr(
        "id", f"CASE WHEN id % 10 < 7 THEN {hot} ELSE id % 997 END AS key", "repeat('x', 20) AS pad")
    with shuffle_partitions(spark, 16):
        (df.write.format("pipelined").mode("overwrite").option("exchange", name)
           .option("partitioner", "hash").option("keys", "key").save())
    options = dict(advisoryPartitionSize="64k", skewedPartitionThreshold="64k", skewedPartitionFactor=3)
    plain = read(spark, name, **options)
    split = read(spark, name, splitSkewedSubpartitions="true", **options)
    assert split.rdd.getNumPartitions() > plain.rdd.getNumPartitions()
    assert_df_equality(split, df, ignore_row_order=True)
    rows = split.select("key", F.spark_partition_id().alias("part"),
                        F.expr("pmod(hash(key), 16)").alias("sub")).distinct().collect()
    hot_sub = next(r["sub"] for r in rows if r["key"] == hot)
    hot_parts = {r["part"] for r in rows if r["sub"] == hot_sub}
    assert len(hot_parts) > 1  # the hot subpartition came from several read tasks
    parts_of_key: dict[int, set[int]] = {}
    for r in rows:
        if r["sub"] != hot_sub:
            parts_of_key.setdefault(r["key"], set()).add(r["part"])
    assert all(len(p) == 1 for p in parts_of_key.values())  # every other key in one read partition
    assert not hot_parts & set().union(*parts_of_key.values())  # the split tasks read the hot subpartition only
    ex.drop_exchange(name)


def test_split_skewed_subpartitions_on_an_exact_width_exchange_is_refused(spark):
    name = unique("skew-exact")
    spark.range(0, 100).selectExpr("id AS key").write.format("pipelined").mode("overwrite") \
        .option("exchange", name).option("keys", "key").option("numSubpartitions", 3).save()
    with pytest.raises(Exception, match="splitSkewedSubpartitions applies to exchanges written without numSubpartitions"):
        read(spark, name, splitSkewedSubpartitions="true").collect()
    ex.drop_exchange(name)
