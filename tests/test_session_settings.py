"""Session settings (option > session > spark-defaults.conf > default) and the errors a user reads.

Runs on the shared classic session: every test that sets a ``spark.sparkflow.exchange.*`` key unsets
it and registers again, so later tests see the session as it was.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import pyarrow as pa
import pytest

import sparkflow_exchange
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.config import ENV_CONF, PREFIX, ExchangeConfig

pytestmark = pytest.mark.spark
TRACEBACK = "Traceback (most recent call last)"


@contextmanager
def session_conf(spark, **settings):
    """Set spark.sparkflow.exchange.<key> on the session for the block; unset and re-register after."""
    for key, value in settings.items():
        spark.conf.set(PREFIX + key.replace("__", "."), str(value))
    try:
        yield
    finally:
        for key in settings:
            spark.conf.unset(PREFIX + key.replace("__", "."))
        sparkflow_exchange.register(spark)


# ------------------------------------------------------------------ the layers, without Spark
def test_precedence_option_session_file_default(monkeypatch):
    monkeypatch.delenv(ENV_CONF, raising=False)
    file = {PREFIX + "partitionType": "BLOCKING", PREFIX + "compression": "zstd", PREFIX + "bufferTimeout": "1s"}
    session = {PREFIX + "compression": "lz4", PREFIX + "bufferTimeout": "2s", "spark.master": "local"}
    cfg = ExchangeConfig.load({"bufferTimeout": "3s"}, spark_conf=file, session=session)
    assert cfg.partition_type == "BLOCKING"   # file beats the default
    assert cfg.compression == "lz4"           # session beats the file
    assert cfg.buffer_timeout == 3.0          # option beats the session
    assert cfg.buffers_per_channel == 2       # default


def test_a_task_takes_only_task_keys_from_its_session_and_options_still_win():
    planned = ExchangeConfig.load({"exchange": "x", "readerTimeout": "5", "keys": "a"}, spark_conf={})
    task_session = {PREFIX + "readerTimeout": "1", PREFIX + "producerTimeout": "2", PREFIX + "keys": "b",
                    PREFIX + "partitioner": "broadcast"}
    cfg = planned.for_task({"exchange": "x", "readerTimeout": "5", "keys": "a"}, task_session)
    assert cfg.reader_timeout == 5.0     # the option wins
    assert cfg.producer_timeout == 2.0   # a task key from the session
    assert cfg.keys == ("a",) and cfg.partitioner == "hash"  # planning keys keep what planning used
    with pytest.raises(sparkflow_exchange.ConfigError, match="session setting spark.sparkflow.exchange.readerTimeout"):
        planned.for_task({}, {PREFIX + "readerTimeout": "soon"})


def test_a_bad_session_setting_is_named():
    with pytest.raises(sparkflow_exchange.ConfigError, match=r"session setting \(spark.sparkflow.exchange.bufferSzie\)"):
        ExchangeConfig.load({}, spark_conf={}, session={PREFIX + "bufferSzie": "1k"})


# ------------------------------------------------------------------ on a real session
def test_declare_timeout_set_on_the_session_reaches_planning_through_register(spark):
    with session_conf(spark, declareTimeout="2"):
        sparkflow_exchange.register(spark)
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            spark.read.format("pipelined").option("exchange", "never-written").load()
        took = time.monotonic() - start
    assert 1.5 < took < 20, took
    text = str(info.value)
    assert "sparkflow_exchange.ExchangeNotFound: exchange 'never-written' does not exist (waited 2 s" in text
    assert TRACEBACK not in text


def test_planning_key_from_the_session_and_an_option_beats_it(spark):
    df = spark.range(0, 50, 1, 2)
    with session_conf(spark, partitionType="BLOCKING", numSubpartitions="3"):
        sparkflow_exchange.register(spark)
        df.write.format("pipelined").mode("overwrite").option("exchange", "sess-a").option("keys", "id").save()
        (df.write.format("pipelined").mode("overwrite").option("exchange", "sess-b").option("keys", "id")
           .option("partitionType", "HYBRID").save())
    found = {e.name: e for e in sparkflow_exchange.list_exchanges()}
    assert (found["sess-a"].partition_type, found["sess-a"].num_subpartitions) == ("BLOCKING", 3)
    assert (found["sess-b"].partition_type, found["sess-b"].num_subpartitions) == ("HYBRID", 3)
    assert spark.read.format("pipelined").option("exchange", "sess-a").load().count() == 50
    for name in ("sess-a", "sess-b"):
        sparkflow_exchange.drop_exchange(name, spark=spark)


def test_write_helper_brings_session_settings_to_planning_without_register(spark):
    with session_conf(spark, partitionType="BLOCKING"):
        sparkflow_exchange.write(spark.range(0, 20, 1, 2), "sess-helper", keys="id")
        assert {e.name: e for e in sparkflow_exchange.list_exchanges(spark)}["sess-helper"].partition_type == "BLOCKING"
    sparkflow_exchange.drop_exchange("sess-helper")


def test_task_key_set_on_the_session_applies_without_register(spark):
    """readerTimeout: a read of an exchange whose only producer never sends fails after the session's 2 s."""
    schema = pa.schema([pa.field("id", pa.int64())])
    cfg = ExchangeConfig.load({"exchange": "silent", "keys": "id", "numSubpartitions": "1"})
    handle = ex.declare_write(cfg, schema, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "silent-0")  # registered, writes nothing, never finishes
    try:
        with session_conf(spark, readerTimeout="2"):  # no register: readerTimeout is read in the task
            start = time.monotonic()
            with pytest.raises(Exception) as info:
                spark.read.format("pipelined").option("exchange", "silent").load().collect()
            took = time.monotonic() - start
    finally:
        producer.fail("test over")
        sparkflow_exchange.drop_exchange("silent")
    text = str(info.value)
    assert "sparkflow_exchange.ExchangeReadError: no data from exchange 'silent' for readerTimeout=2 s" in text
    assert took < 60, took  # the default is 600 s
    assert TRACEBACK not in text


# ------------------------------------------------------------------ expected errors read well
def test_bad_option_and_schema_mismatch_name_the_problem_without_traceback(spark):
    with pytest.raises(Exception) as info:
        spark.range(3).write.format("pipelined").mode("overwrite").option("exchange", "x").option("bufferSzie", "1").save()
    text = str(info.value)
    assert "sparkflow_exchange.ConfigError: unknown option 'bufferszie' (did you mean 'bufferSize'?)" in text
    assert TRACEBACK not in text

    spark.range(0, 10, 1, 2).write.format("pipelined").mode("overwrite").option("exchange", "typed") \
        .option("keys", "id").option("numSubpartitions", "2").save()
    with pytest.raises(Exception) as info:
        spark.read.format("pipelined").option("exchange", "typed").schema("id string").load().collect()
    text = str(info.value)
    assert "sparkflow_exchange.SchemaMismatch: the given schema does not match exchange 'typed'" in text
    assert TRACEBACK not in text
    sparkflow_exchange.drop_exchange("typed")
