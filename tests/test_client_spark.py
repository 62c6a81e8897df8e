"""Exchanges cross between Spark and plain Python (open_reader / open_writer), hash placement included."""
from __future__ import annotations

import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

import sparkflow_exchange as sfe
from test_datasource import read, sample_df, unique, write

pytestmark = pytest.mark.spark


def test_open_writer_places_rows_where_spark_hash_partitioning_does(spark):
    df = sample_df(spark, n=1500)
    table = df.toArrow()
    name = unique("client-w")
    n = 5
    with sfe.open_writer(name, table.schema, keys=["s", "k"], num_subpartitions=n, bufferSize="16k") as w:
        for batch in table.to_batches(max_chunksize=700):
            w.write(batch)
    got = read(spark, name).withColumn("pid", F.spark_partition_id())
    assert got.rdd.getNumPartitions() == n
    expected = df.repartition(n, "s", "k").withColumn("pid", F.spark_partition_id())
    assert_df_equality(expected, got, ignore_row_order=True)


def test_spark_write_reads_back_exactly_per_subpartition(spark):
    df = sample_df(spark, n=2500, parts=3)
    name = unique("client-r")
    n = 4
    write(df, name, partitioner="hash", keys="k", numSubpartitions=n)
    placed = df.repartition(n, "k").withColumn("pid", F.spark_partition_id()).toArrow()
    for sub in range(n):
        got = sfe.open_reader(name, subpartitions=sub).read_all()
        want = placed.filter(pc.equal(placed.column("pid"), sub)).drop_columns(["pid"])
        assert want.num_rows > 0
        assert got.schema.equals(want.schema)
        assert got.sort_by("id").equals(want.sort_by("id").cast(got.schema))
    whole = sfe.open_reader(name, columns=["id", "k"]).read_all()
    assert sorted(whole.column("id").to_pylist()) == list(range(2500))
