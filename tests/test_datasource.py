"""format("pipelined") end to end on a real local SparkSession and the embedded service."""
from __future__ import annotations

import itertools
import threading
import time

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark

_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{time.monotonic_ns() % 10**6}"


def sample_df(spark, n: int = 1200, parts: int = 3):
    """Nulls, multi-byte strings, decimals, dates, timestamps, arrays, maps and structs."""
    return spark.range(0, n, 1, parts).selectExpr(
        "id",
        "CAST(IF(id % 7 = 0, NULL, id % 13) AS INT) AS k",
        "IF(id % 5 = 0, NULL, concat('s', CAST(id AS STRING), repeat('é', CAST(id % 3 AS INT)))) AS s",
        "CAST(id * 1.25 AS DECIMAL(12,2)) AS d",
        "IF(id % 11 = 0, NULL, CAST(id AS DECIMAL(30,5)) * -3) AS big",
        "date_add(DATE'2020-01-01', CAST(id % 1000 AS INT)) AS dt",
        "TIMESTAMP'2024-03-01 12:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS ts",
        "IF(id % 4 = 0, NULL, array(CAST(id AS INT), NULL, 3)) AS arr",
        "map('a', CAST(id AS INT), 'b', NULL) AS m",
        "named_struct('a', CAST(id AS INT), 'b', CAST(id AS STRING)) AS st",
        "id % 2 = 0 AS flag",
        "IF(id % 9 = 0, NULL, id / 3.0D) AS f",
    )


def write(df, name: str, **options):
    w = df.write.format("pipelined").mode(options.pop("mode", "overwrite")).option("exchange", name)
    for key, value in options.items():
        w = w.option(key, str(value))
    w.save()


def read(spark, name: str, **options):
    r = spark.read.format("pipelined").option("exchange", name)
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


PARTITIONERS = {
    "hash": {"partitioner": "hash", "keys": "k,s", "numSubpartitions": 4},
    "broadcast": {"partitioner": "broadcast", "numSubpartitions": 4},
    "forward": {"partitioner": "forward"},
    "rebalance": {"partitioner": "rebalance", "numSubpartitions": 4},
    "rescale": {"partitioner": "rescale", "numSubpartitions": 6},
    "custom": {"partitioner": "custom", "custom": "faults:by_id_mod", "numSubpartitions": 5},
}


@pytest.mark.parametrize("partition_type", ["HYBRID", "BLOCKING", "PIPELINED_BOUNDED"])
@pytest.mark.parametrize("partitioner", list(PARTITIONERS))
def test_round_trip_every_partitioner_and_type(spark, partitioner, partition_type):
    df = sample_df(spark)
    name = unique(f"rt-{partitioner}-{partition_type}")
    write(df, name, partitionType=partition_type, **PARTITIONERS[partitioner])
    result = read(spark, name)
    if partition_type == "PIPELINED_BOUNDED":
        result = result.localCheckpoint(eager=True)  # consume once: every later action uses this copy
    if partitioner == "broadcast":
        # every read partition holds every row
        assert result.rdd.getNumPartitions() == 4
        per_partition = result.groupBy(F.spark_partition_id().alias("p")).count().collect()
        assert sorted(r["count"] for r in per_partition) == [df.count()] * 4
        result = result.where(F.spark_partition_id() == 0)
    assert_df_equality(df, result, ignore_row_order=True)


def test_broadcast_without_width_serves_every_reader(spark):
    """No numSubpartitions: the width is the producer count, fixed at commit; one stored copy serves all."""
    name = unique("bcast-shared")
    dim = spark.range(0, 50, 1, 2)
    write(dim, name, partitioner="broadcast")
    got = read(spark, name)
    assert got.rdd.getNumPartitions() == 2
    counts = got.groupBy(F.spark_partition_id()).count().collect()
    assert sorted(r["count"] for r in counts) == [50, 50]


def test_hash_places_rows_as_spark_repartition(spark):
    df = sample_df(spark, n=3000)
    name = unique("hash-place")
    n = 7
    write(df, name, partitioner="hash", keys="s,k", numSubpartitions=n)
    got = read(spark, name).withColumn("pid", F.spark_partition_id())
    wrong = got.where(F.col("pid") != F.pmod(F.hash("s", "k"), F.lit(n))).count()
    assert wrong == 0
    assert got.rdd.getNumPartitions() == n
    expected = df.repartition(n, "s", "k").withColumn("pid", F.spark_partition_id())
    assert_df_equality(expected, got, ignore_row_order=True)


def test_rebalance_sizes_differ_by_at_most_producer_count(spark):
    producers = 3
    df = spark.range(0, 1001, 1, producers)
    name = unique("rebalance")
    write(df, name, partitioner="rebalance", numSubpartitions=4)
    sizes = [r["count"] for r in read(spark, name).groupBy(F.spark_partition_id()).count().collect()]
    assert sum(sizes) == 1001
    assert max(sizes) - min(sizes) <= producers


def test_forward_with_unequal_parallelism_is_a_clear_error(spark):
    with pytest.raises(Exception, match="forward needs equal parallelism"):
        write(spark.range(0, 10, 1, 3), unique("fwd-bad"), partitioner="forward", numSubpartitions=2)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"partitioner": "zigzag", "numSubpartitions": 2}, "unknown partitioner 'zigzag'"),
        ({"partitioner": "hash", "numSubpartitions": 2}, "keys"),
        ({"partitioner": "hash", "keys": "nope", "numSubpartitions": 2}, "nope"),
        ({"partitioner": "hash", "keys": "id", "numSubpartitions": 0}, "numSubpartitions must be at least 1"),
        ({"partitioner": "hash", "keys": "id", "numSubpartitions": 2, "bufferSiz": "1k"}, "(?i)unknown option 'bufferSiz' \\(did you mean 'bufferSize'"),
        ({"partitionType": "PIPELINED", "partitioner": "broadcast"}, "unknown partitionType 'PIPELINED'"),
    ],
)
def test_bad_write_options_are_named(spark, options, message):
    with pytest.raises(Exception, match=message):
        write(spark.range(10), unique("bad"), **options)


def test_write_without_exchange_option_is_refused(spark):
    with pytest.raises(Exception, match="'exchange' option is required"):
        spark.range(3).write.format("pipelined").mode("overwrite").save()


def test_append_adds_producers_and_refuses_another_schema(spark):
    name = unique("append")
    write(spark.range(0, 10, 1, 2), name, partitioner="hash", keys="id", numSubpartitions=2)
    write(spark.range(10, 20, 1, 2), name, mode="append", partitioner="hash", keys="id", numSubpartitions=2)
    assert sorted(r.id for r in read(spark, name).collect()) == list(range(20))
    assert committed_rows(name) == 20  # each commit checked its producers' rows and added them up
    with pytest.raises(Exception, match="append to exchange .* with another schema") as refused:
        write(spark.range(3).selectExpr("CAST(id AS STRING) AS id"), name, mode="append", partitioner="hash",
              keys="id", numSubpartitions=2)
    # Spark's type names, as the user wrote them, not Arrow's (int64, large_string)
    assert "the exchange holds (id bigint NOT NULL), this write has (id string" in str(refused.value)
    write(spark.range(0, 4, 1, 1), name, partitioner="hash", keys="id", numSubpartitions=2)  # overwrite replaces
    assert sorted(r.id for r in read(spark, name).collect()) == list(range(4))
    assert committed_rows(name) == 4


def committed_rows(name: str) -> int | None:
    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange.config import ExchangeConfig

    return ex.describe_exchange(ExchangeConfig.load({"exchange": name}), wait=False).rows


def test_drop_exchange_then_read_waits_and_names_it(spark):
    import sparkflow_exchange

    name = unique("drop")
    write(spark.range(5), name, partitioner="broadcast")
    sparkflow_exchange.drop_exchange(name)
    with pytest.raises(Exception, match=f"exchange '{name}' does not exist"):
        read(spark, name, declareTimeout="1s").collect()


def test_read_of_missing_exchange_fails_after_declare_timeout(spark):
    start = time.monotonic()
    with pytest.raises(Exception, match="exchange 'never-written' does not exist"):
        read(spark, "never-written", declareTimeout="2s").collect()
    assert time.monotonic() - start >= 2


def test_user_schema_must_match(spark):
    name = unique("schema")
    write(spark.range(5), name, partitioner="forward")
    with pytest.raises(Exception, match="does not match exchange") as refused:
        spark.read.format("pipelined").option("exchange", name).schema("id string").load().collect()
    assert "given (id string), exchange has (id bigint NOT NULL)" in str(refused.value)
    ok = spark.read.format("pipelined").option("exchange", name).schema("id long not null").load()
    assert sorted(r.id for r in ok.collect()) == list(range(5))


def test_schema_messages_name_spark_types(spark):
    name = unique("decimal")
    write(spark.range(3).selectExpr("CAST(id AS DECIMAL(2,1)) AS `d d`", "array(id) AS a"), name,
          partitioner="forward")
    with pytest.raises(Exception, match="does not match exchange") as refused:
        spark.read.format("pipelined").option("exchange", name).schema("`d d` double, a array<bigint>").load().collect()
    text = str(refused.value)
    assert "exchange has (`d d` decimal(2,1), a array<bigint> NOT NULL)" in text, text
    assert "decimal128" not in text and "int64" not in text, text


def test_pipelined_read_while_writing_in_another_thread(spark):
    """The read starts first, waits for the declaration, and receives rows as they are produced."""
    name = unique("concurrent")
    df = spark.range(0, 200_000, 1, 2).selectExpr("id", "id % 10 AS k")
    result: dict = {}

    def reader():
        result["rows"] = read(spark, name, declareTimeout="60s").groupBy().agg(
            F.count("*").alias("n"), F.sum("id").alias("s")).collect()[0]

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(3)
    spark._jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(spark._jsparkSession)
    write(df, name, partitioner="hash", keys="k", numSubpartitions=2, partitionType="PIPELINED_BOUNDED",
          buffersPerPartition=2, bufferSize="32k")
    t.join(120)
    assert not t.is_alive()
    assert result["rows"]["n"] == 200_000
    assert result["rows"]["s"] == sum(range(200_000))


def test_killed_write_task_is_retried_and_rows_arrive_once(spark):
    from pathlib import Path

    from conftest import RUNTIME_DIR

    marker = Path(RUNTIME_DIR) / "kill-marker"
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark.range(0, 5000, 1, 2)
        name = unique("kill9")
        write(df, name, partitioner="custom", custom="faults:kill_first_attempt", numSubpartitions=3,
              bufferSize="1k", bufferTimeout="10ms")
        assert_df_equality(df, read(spark, name), ignore_row_order=True)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert marker.exists(), "the first attempt's Python worker was not killed: the test proved nothing"


def _fail_first_attempt(iterator):
    from pyspark import TaskContext

    ctx = TaskContext.get()
    for i, batch in enumerate(iterator):
        if ctx.attemptNumber() == 0 and ctx.partitionId() == 0 and i >= 1:
            raise RuntimeError("injected read failure")
        yield batch


@pytest.mark.parametrize("partition_type", ["HYBRID", "BLOCKING"])
def test_failed_read_task_is_retried_and_rereads(spark, partition_type):
    name = unique(f"reread-{partition_type}")
    df = spark.range(0, 20_000, 1, 2)
    write(df, name, partitioner="hash", keys="id", numSubpartitions=2, partitionType=partition_type, bufferSize="4k")
    got = read(spark, name).mapInArrow(_fail_first_attempt, df.schema)
    assert_df_equality(df, got, ignore_row_order=True)


def test_pipelined_bounded_cannot_be_reread(spark):
    name = unique("once")
    write(spark.range(0, 100, 1, 1), name, partitioner="forward", partitionType="PIPELINED_BOUNDED")
    assert read(spark, name).count() == 100
    with pytest.raises(Exception, match="re-reading is impossible"):
        read(spark, name).count()


def test_read_without_producers_fails_after_producer_timeout_and_mentions_slots(spark):
    import pyarrow as pa

    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange import write_handle as wh
    from sparkflow_exchange.config import ExchangeConfig

    name = unique("no-producers")
    config = ExchangeConfig.load({"exchange": name, "partitioner": "hash", "keys": "id", "numSubpartitions": "2"})
    handle = ex.declare_write(config, pa.schema([pa.field("id", pa.int64(), nullable=False)]), overwrite=True)
    try:
        start = time.monotonic()
        with pytest.raises(Exception, match=r"no producer of exchange .* registered within producerTimeout=2 s.*task slots"):
            read(spark, name, producerTimeout="2s").collect()
        assert time.monotonic() - start < 60
    finally:
        wh.abort_write(handle, "test over")


def test_write_helper_fills_the_width_and_works_from_a_fresh_thread(spark):
    import sparkflow_exchange

    df = spark.range(0, 300, 1, 3)
    name = unique("helper")
    errors: list = []

    def writer():
        try:
            sparkflow_exchange.write(df, name, partitioner="hash", keys="id")
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    t.join(120)
    assert not errors, errors
    got = read(spark, name)
    assert got.rdd.getNumPartitions() == 3  # the DataFrame's partition count
    assert sorted(r.id for r in got.collect()) == list(range(300))
