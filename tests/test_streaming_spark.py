"""Structured Streaming through the exchange with real Spark queries: a rate source written by
one query, read by others, with stops and restarts from checkpoints; every row arrives exactly once."""
from __future__ import annotations

import time

from chispa import assert_df_equality
from pyspark.sql import functions as F

import sparkflow_exchange
from sparkflow_exchange import exchange as ex


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def stream_info(name: str) -> dict:
    """The coordinator's own description of the stream (its groups, retained bytes and epochs)."""
    return [e for e in ex.list_exchanges() if e["name"] == name][0]


def start_writer(spark, name: str, checkpoint: str, **options):
    rate = spark.readStream.format("rate").option("rowsPerSecond", 400).option("numPartitions", 2).load()
    writer = (rate.writeStream.format("pipelined").option("exchange", name).option("keys", "value")
              .option("numSubpartitions", 3).option("checkpointLocation", checkpoint))
    for k, v in options.items():
        writer = writer.option(k, v)
    return writer.trigger(processingTime="500 milliseconds").start()


def start_reader(spark, name: str, checkpoint: str, out: str, available_now: bool = False, **options):
    reader = spark.readStream.format("pipelined").option("exchange", name)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = reader.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
    return query.trigger(availableNow=True).start() if available_now else \
        query.trigger(processingTime="500 milliseconds").start()


def committed_batches(query) -> int:
    return query.lastProgress["batchId"] if query.lastProgress else -1


def assert_exactly_once(spark, out: str, expected_max: int) -> None:
    got = spark.read.parquet(out)
    stats = got.agg(F.count("*").alias("n"), F.countDistinct("value").alias("d"), F.max("value").alias("m")).first()
    assert (stats.n, stats.d, stats.m) == (expected_max + 1, expected_max + 1, expected_max)
    assert_df_equality(got.select("value"), spark.range(expected_max + 1).select(F.col("id").alias("value")),
                       ignore_row_order=True, ignore_nullable=True)


def test_writer_and_reader_restarted_from_checkpoints_deliver_every_row_exactly_once(spark, tmp_path):
    name = "stream-restarts"
    wck, rck, out = str(tmp_path / "wck"), str(tmp_path / "rck"), str(tmp_path / "out")
    writer = start_writer(spark, name, wck)
    wait_for(lambda: stream_info(name)["last_committed"] >= 1 if name in
             {e.name for e in sparkflow_exchange.list_exchanges()} else False, 600, "the writer's first epochs")
    reader = start_reader(spark, name, rck, out)
    wait_for(lambda: committed_batches(reader) >= 1, 600, "the reader's first micro-batches")
    reader.stop()  # the reader stops; the writer goes on
    time.sleep(1.5)
    reader = start_reader(spark, name, rck, out)  # and comes back from its checkpoint
    writer.stop()  # the writer stops too
    writer = start_writer(spark, name, wck)  # and comes back from its own (it replays its last batch)
    last = stream_info(name)["last_committed"]
    wait_for(lambda: stream_info(name)["last_committed"] >= last + 1, 600, "the restarted writer")
    writer.stop()
    final = stream_info(name)["last_committed"]
    wait_for(lambda: all(g["position"] == final for g in stream_info(name)["groups"].values()), 600,
             f"the reader to be done with epoch {final}")
    reader.stop()
    expected_max = spark.read.parquet(out).agg(F.max("value")).first()[0]
    assert_exactly_once(spark, out, expected_max)
    info = stream_info(name)
    assert info["retained_epochs"] == 0 and info["retained_bytes"] == 0  # its one group read everything
    sparkflow_exchange.drop_exchange(name)


def test_two_groups_read_independently_and_available_now_stops(spark, tmp_path):
    name = "stream-groups"
    wck = str(tmp_path / "wck")
    outs = {g: str(tmp_path / f"out-{g}") for g in ("a", "b")}
    # both groups are known to the stream from its start (a group that joins later would start at what is
    # still retained: epochs every known group is past are released); b reads one epoch per micro-batch
    writer = start_writer(spark, name, wck, **{"stream.consumerGroups": "a,b"})
    wait_for(lambda: name in {e.name for e in sparkflow_exchange.list_exchanges()}, 600, "the stream")
    a = start_reader(spark, name, str(tmp_path / "rck-a"), outs["a"], consumerGroup="a")
    b = start_reader(spark, name, str(tmp_path / "rck-b"), outs["b"], consumerGroup="b", maxEpochsPerTrigger=1)
    wait_for(lambda: stream_info(name)["last_committed"] >= 4, 600, "five epochs")
    writer.stop()
    final = stream_info(name)["last_committed"]
    wait_for(lambda: stream_info(name)["groups"].get("a", {}).get("position") == final, 600, "group a")
    a.stop()
    b.stop()  # b is behind: its epochs stay retained for it
    done = start_reader(spark, name, str(tmp_path / "rck-b"), outs["b"], available_now=True, consumerGroup="b")
    assert done.awaitTermination(120), "availableNow did not stop by itself"
    expected_max = spark.read.parquet(outs["a"]).agg(F.max("value")).first()[0]
    for g in ("a", "b"):
        assert_exactly_once(spark, outs[g], expected_max)
    info = stream_info(name)
    assert info["retained_epochs"] == 0 and info["retained_bytes"] == 0
    sparkflow_exchange.drop_exchange(name)


def test_a_slow_reader_holds_the_writer_back_and_still_gets_everything(spark, tmp_path):
    name = "stream-bounded"
    out = str(tmp_path / "out")
    writer = start_writer(spark, name, str(tmp_path / "wck"), **{"stream.maxRetainedBytes": "4k"})
    wait_for(lambda: name in {e.name for e in sparkflow_exchange.list_exchanges()}, 600, "the stream")
    wait_for(lambda: (stream_info(name)["writer_waiting_s"] or 0) > 1.0, 600, "the writer to wait for a reader")
    waiting_at = stream_info(name)["last_committed"]
    time.sleep(1.5)
    assert stream_info(name)["last_committed"] == waiting_at  # no reader: no new epoch
    reader = start_reader(spark, name, str(tmp_path / "rck"), out, maxEpochsPerTrigger=1)
    wait_for(lambda: stream_info(name)["last_committed"] >= waiting_at + 3, 600, "the writer to go on")
    writer.stop()
    final = stream_info(name)["last_committed"]
    wait_for(lambda: stream_info(name)["groups"] and
             min(g["position"] for g in stream_info(name)["groups"].values()) == final, 120, "the reader to finish")
    reader.stop()
    expected_max = spark.read.parquet(out).agg(F.max("value")).first()[0]
    assert_exactly_once(spark, out, expected_max)
    sparkflow_exchange.drop_exchange(name)
