"""Exchanges cross between Spark and plain Python (open_reader / open_writer), hash placement included."""
from __future__ import annotations

import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from test_datasource import read, sample_df, unique, write

import sparkflow_exchange as sfe

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


def _scan_exchange(name: str, **settings):
    """The lazy-scan recipe of docs/out-of-spark.md: polars pushes its projection into open_reader."""
    import polars as pl
    from polars.io.plugins import register_io_source

    schema = pl.from_arrow(sfe.client.read_plan(name, **settings).arrow_schema.empty_table()).schema

    def source(with_columns, predicate, n_rows, batch_size):
        reader = sfe.open_reader(name, columns=with_columns, **settings)
        for batch in reader:
            frame = pl.from_arrow(batch)
            if predicate is not None:
                frame = frame.filter(predicate)
            if n_rows is not None:
                frame = frame.head(n_rows)
                n_rows -= frame.height
            yield frame
            if n_rows is not None and n_rows <= 0:
                reader.close()
                return

    return register_io_source(source, schema=schema)


def test_duckdb_and_polars_over_open_reader_give_sparks_answer(spark):
    duckdb = pytest.importorskip("duckdb", reason="duckdb is in the test extra: pip install -e '.[test]'")
    pl = pytest.importorskip("polars", reason="polars is in the test extra: pip install -e '.[test]'")
    df = spark.range(0, 20_000, 1, 3).selectExpr("id", "id % 37 AS k", "CAST(id % 101 AS DOUBLE) * 0.5 AS x",
                                                 "concat('s', CAST(id % 5 AS STRING)) AS s")
    name = unique("client-sql")
    write(df, name, partitioner="hash", keys="k", numSubpartitions=4)
    spark_answer = [tuple(r) for r in read(spark, name).where("x > 10").groupBy("k")
                    .agg(F.count("*").alias("n"), F.sum("x").alias("total")).orderBy("k").collect()]
    assert len(spark_answer) == 37

    reader = sfe.open_reader(name, columns=["k", "x"])  # DuckDB pushes no projection into a reader
    duck = duckdb.connect()
    duck.register("ex", reader)
    assert duck.sql("SELECT k, count(*) AS n, sum(x) AS total FROM ex WHERE x > 10 "
                    "GROUP BY k ORDER BY k").fetchall() == spark_answer

    query = lambda frame: (frame.filter(pl.col("x") > 10).group_by("k")  # noqa: E731
                           .agg(pl.len().alias("n"), pl.col("x").sum().alias("total")).sort("k"))
    eager = query(pl.from_arrow(sfe.open_reader(name, columns=["k", "x"])))
    assert [tuple(r) for r in eager.iter_rows()] == spark_answer
    lazy = query(_scan_exchange(name)).collect()
    assert [tuple(r) for r in lazy.iter_rows()] == spark_answer

    # one subpartition: the rows Spark's read partition of the same index holds
    part = read(spark, name).where(F.spark_partition_id() == 2).groupBy("s").count().orderBy("s").collect()
    duck.register("sub2", sfe.open_reader(name, subpartitions=2, columns=["s"]))
    assert duck.sql("SELECT s, count(*) FROM sub2 GROUP BY s ORDER BY s").fetchall() == [tuple(r) for r in part]
