"""sparkflow_exchange.configure(builder): the plugin jar merged into spark.jars and the recommended settings
added, never overriding what the user set, idempotent; and a session built with it serves format("pipelined")
in the JVM (the quickstart, as the README's first command runs it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import sparkflow_exchange
from sparkflow_exchange.errors import ConfigError
from sparkflow_exchange.spark.session_setup import (
    EXTENSIONS,
    JARS,
    RECOMMENDED,
    WARMUP_EXTENSION,
    _submit_args,
    settings_to_add,
)

ROOT = Path(__file__).parent.parent
JAR = "/opt/site/sparkflow_exchange/jars/sparkflow-exchange-plugin.jar"
BUCKETING = "spark.sql.sources.v2.bucketing.shuffle.enabled"


def added(options=None, *, defaults=None, submit=None, running=None, remote=None, settings=True) -> dict:
    return settings_to_add(options or {}, jar=JAR, spark_defaults=defaults or {}, submit=submit or {},
                           running_jars=running, remote=remote, settings=settings)


def test_a_bare_builder_gets_the_jar_and_every_recommended_setting():
    assert added() == {JARS: JAR, EXTENSIONS: WARMUP_EXTENSION, **RECOMMENDED}
    assert RECOMMENDED[BUCKETING] == "true"


def test_the_jar_is_appended_to_the_users_jars_never_replacing_them():
    assert added({JARS: "/a.jar, hdfs://nn/b.jar"})[JARS] == f"/a.jar,hdfs://nn/b.jar,{JAR}"


def test_without_jars_on_the_builder_the_submit_args_then_spark_defaults_are_kept():
    """A builder's spark.jars replaces the launcher's: their jars must be in the merged value."""
    assert added(defaults={JARS: "/d.jar"})[JARS] == f"/d.jar,{JAR}"
    assert added(defaults={JARS: "/d.jar"}, submit={JARS: "/s.jar"})[JARS] == f"/s.jar,{JAR}"  # as in spark-submit
    assert added({JARS: "/b.jar"}, defaults={JARS: "/d.jar"}, submit={JARS: "/s.jar"})[JARS] == f"/b.jar,{JAR}"


def test_the_warmup_is_appended_to_the_users_extensions_once():
    theirs = "io.delta.sql.DeltaSparkSessionExtension"
    assert added({EXTENSIONS: theirs})[EXTENSIONS] == f"{theirs},{WARMUP_EXTENSION}"
    assert added(defaults={EXTENSIONS: theirs})[EXTENSIONS] == f"{theirs},{WARMUP_EXTENSION}"
    assert EXTENSIONS not in added({EXTENSIONS: f"{theirs},{WARMUP_EXTENSION}"})


def test_a_users_setting_wins_over_every_recommended_one():
    options = {BUCKETING: "false"}
    got = added(options, defaults={k: "x" for k in RECOMMENDED if k != BUCKETING})
    assert set(got) == {JARS, EXTENSIONS}, got
    assert added(settings=False) == {JARS: JAR, EXTENSIONS: WARMUP_EXTENSION}
    assert BUCKETING not in added(submit={BUCKETING: "false"})  # --conf in PYSPARK_SUBMIT_ARGS


def test_a_plugin_jar_already_listed_is_not_added_again():
    mine = "local:/cluster/sparkflow-exchange-plugin.jar"
    assert JARS not in added({JARS: mine})
    assert JARS not in added({JARS: f"/a.jar,{JAR}"})


def test_configure_twice_changes_nothing_the_second_time():
    """On real builders (of Connect's in-process local server: what it adds does not depend on whether this test
    process already runs a classic SparkContext, as it does when the shared session started before)."""
    from pyspark.sql import SparkSession

    def builder():
        return SparkSession.builder.remote("local[2]").config(JARS, "/a.jar")

    once = dict(sparkflow_exchange.configure(builder())._options)
    twice = dict(sparkflow_exchange.configure(sparkflow_exchange.configure(builder()))._options)
    assert once == twice and once[JARS] == f"/a.jar,{sparkflow_exchange.plugin_jar()}", once
    assert once[EXTENSIONS] == WARMUP_EXTENSION and once[BUCKETING] == "true", once


def test_a_remote_connect_server_gets_the_settings_only():
    assert added(remote="sc://host:15002") == RECOMMENDED
    assert added(remote="local[4]")[JARS] == JAR  # Connect's local server runs in this process: spark.jars reaches it


def test_a_running_context_without_the_jar_is_refused_with_one_line():
    with pytest.raises(ConfigError, match=r"already running without the plugin jar.*before the application's first session"):
        added(running=["/a.jar"])
    assert added(running=[f"file:{JAR}"]) == RECOMMENDED  # it has the jar: nothing to change but the settings


def test_the_launchers_jars_and_extensions_are_read_from_pyspark_submit_args(monkeypatch):
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--master local[2] --jars /x.jar,/y.jar --conf {EXTENSIONS}=a.B pyspark-shell")
    assert _submit_args() == {JARS: "/x.jar,/y.jar", EXTENSIONS: "a.B"}
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--conf {BUCKETING}=false pyspark-shell")
    assert _submit_args() == {BUCKETING: "false"}
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--jars=/z.jar pyspark-shell")
    assert _submit_args() == {JARS: "/z.jar"}
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    assert _submit_args() == {}


def test_not_a_builder_is_refused():
    with pytest.raises(ConfigError, match="takes a SparkSession builder"):
        sparkflow_exchange.configure("local[2]")


@pytest.mark.spark
def test_configure_refuses_once_the_shared_session_runs_without_the_jar(spark):
    from pyspark.sql import SparkSession

    with pytest.raises(ConfigError, match="already running without the plugin jar"):
        sparkflow_exchange.configure(SparkSession.builder)


@pytest.mark.spark
def test_the_quickstart_runs_through_the_jvm_path(tmp_path):
    """The README's first command's example, in a fresh application: its printed explain() is the JVM scan."""
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    env.pop("SPARK_REMOTE", None)
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], capture_output=True,
                              text=True, timeout=600, env=env)
    finally:
        from harness import stop_embedded
        stop_embedded(tmp_path / "runtime")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "quickstart OK" in proc.stdout
    scan = [line for line in proc.stdout.splitlines() if "BatchScan" in line]
    assert scan and "sparkflow-exchange orders [hash(customer_id, region), 8 subpartitions" in scan[0], scan
    assert "(Python)" not in proc.stdout
