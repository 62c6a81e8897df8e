"""Spark's per-row Arrow batch measurement is off during our writes, and the session is left as it was."""
from __future__ import annotations

import json
import threading

import pytest
from probe_sink import PROBED_KEY, ProbeSink

from sparkflow_exchange.spark.session_tuning import UNCHECKED, unchecked_arrow_batches

pytestmark = pytest.mark.spark


def explicitly_set(spark) -> bool:
    return spark._jsparkSession.sessionState().conf().contains(PROBED_KEY)


def probe_write(spark, out) -> list[dict]:
    """Wide rows (about 200 bytes) so a small byte limit visibly cuts batches."""
    spark.dataSource.register(ProbeSink)
    df = spark.range(0, 30_000, 1, 2).selectExpr("id", "repeat('x', 200) AS s")
    df.write.format("probe_sink").mode("append").option("out", str(out)).save()
    return json.loads(out.read_text())


def test_tasks_see_the_unchecked_setting_only_inside_the_block(spark, tmp_path):
    assert not explicitly_set(spark)
    with unchecked_arrow_batches(spark) as mine:
        assert mine
        inside = probe_write(spark, tmp_path / "inside.json")
    after = probe_write(spark, tmp_path / "after.json")
    assert [t["setting"] for t in inside] == [UNCHECKED, UNCHECKED]
    assert max(max(t["batch_rows"]) for t in inside) == 10_000  # bounded by maxRecordsPerBatch alone
    assert [t["setting"] for t in after] == [None, None]
    assert not explicitly_set(spark)


def test_a_value_the_user_set_wins_and_stays(spark, tmp_path):
    spark.conf.set(PROBED_KEY, "4096")
    try:
        with unchecked_arrow_batches(spark) as mine:
            assert not mine
            seen = probe_write(spark, tmp_path / "user.json")
        assert [t["setting"] for t in seen] == ["4096", "4096"]
        assert max(max(t["batch_rows"]) for t in seen) < 100  # the user's byte limit cut the batches
        assert spark.conf.get(PROBED_KEY) == "4096"
    finally:
        spark.conf.unset(PROBED_KEY)


def test_overlapping_writes_keep_the_setting_until_the_last_one_ends(spark):
    first_in, second_done, release = threading.Event(), threading.Event(), threading.Event()
    observed: list = []

    def first() -> None:
        with unchecked_arrow_batches(spark):
            first_in.set()
            release.wait(30)

    def second() -> None:
        first_in.wait(30)
        with unchecked_arrow_batches(spark) as mine:
            observed.append(mine)
        second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    assert second_done.wait(30)
    assert observed == [True]
    assert spark.conf.get(PROBED_KEY) == UNCHECKED  # the first write is still running
    release.set()
    for t in threads:
        t.join(30)
    assert not explicitly_set(spark)


def test_write_helper_leaves_the_session_as_it_was(spark):
    import sparkflow_exchange

    sparkflow_exchange.write(spark.range(0, 100, 1, 2), "tuning-helper", partitioner="hash", keys="id")
    assert not explicitly_set(spark)
    got = spark.read.format("pipelined").option("exchange", "tuning-helper").load()
    assert sorted(r.id for r in got.collect()) == list(range(100))
    sparkflow_exchange.drop_exchange("tuning-helper")


def test_spark_settings_are_keys_spark_honours(spark):
    """SPARK_SETTINGS names real keys: the shared session sets the socket one (conftest), and Spark's Python
    workers were started on Unix sockets because of it (a misspelt key would be ignored silently)."""
    import os

    from sparkflow_exchange import SPARK_SETTINGS
    from sparkflow_exchange.spark.session_tuning import ARROW_MAX_BYTES_PER_BATCH, PYTHON_WORKER_UNIX_SOCKETS

    assert SPARK_SETTINGS == {PYTHON_WORKER_UNIX_SOCKETS: "true", ARROW_MAX_BYTES_PER_BATCH: UNCHECKED}
    assert spark.sparkContext.getConf().get(PYTHON_WORKER_UNIX_SOCKETS) == "true"
    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED")).collect()
    assert [v.lower() for v in seen] == ["true"]  # Scala prints the boolean: "True"
