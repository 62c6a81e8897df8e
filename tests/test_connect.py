"""Over Spark Connect (``remote("local[4]")``): the main examples and every public helper.

One client application (tests/app_connect.py) in its own process runs them all and reports JSON:
a Connect local server is a JVM of its own (about a minute to start on two busy cores), and this
pytest process already holds the classic shared session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import stop_embedded

pytestmark = [pytest.mark.spark, pytest.mark.connect]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def connect_run(tmp_path_factory):
    pytest.importorskip("grpc", reason="needs the pyspark[connect] extra (pip install -e '.[test]')")
    runtime = tmp_path_factory.mktemp("connect-runtime")
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime)}
    env.pop("SPARK_REMOTE", None)
    try:
        proc = subprocess.run([sys.executable, str(HERE / "app_connect.py")], capture_output=True, text=True,
                              timeout=1500, env=env, cwd=tmp_path_factory.mktemp("connect-cwd"))  # a hang, not a loaded pace
    finally:
        stop_embedded(runtime)  # it keeps the application's exchanges for later readers
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["session"] == "pyspark.sql.connect.session"
    return result


def ok(result: dict, name: str) -> dict:
    part = result[name]
    assert "error" not in part or name == "session_settings", part
    return part


def test_hash_exchange_written_and_read_exactly(connect_run):
    hash_ = ok(connect_run, "hash")
    assert hash_ == {"equal": True, "partitions": 4, "misplaced": 0}


def test_write_list_and_drop_helpers(connect_run):
    helpers = ok(connect_run, "helpers")
    assert helpers["names"] == ["c-forward", "c-hash", "c-helper"]
    assert helpers["dropped"] == {"dropped": "c-helper", "partitions": 3}
    assert helpers["after"] == ["c-forward", "c-hash"]
    assert helpers["forward_partitions"] == 3  # forward without numSubpartitions: one per producer
    assert helpers["arrow_setting_kept"]


def test_session_setting_reaches_planning_through_register(connect_run):
    got = ok(connect_run, "session_settings")
    assert "sparkflow_exchange.ExchangeNotFound: exchange 'c-missing' does not exist (waited 2 s" in got["error"]
    assert "Traceback (most recent call last)" not in got["error"]
    assert got["took"] < 30, got["took"]


def test_quickstart_runs(connect_run):
    lines = ok(connect_run, "quickstart")["lines"]
    assert lines[-1] == "quickstart OK"
    assert "rows: 100000, placed exactly where repartition(8, customer_id, region) would put them: True" in lines
