"""local-cluster[2,1,1024] with the Spark plugin configured only through spark-defaults.conf."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cluster]
HERE = Path(__file__).parent


def _jar() -> str:
    import sparkflow_exchange

    return sparkflow_exchange.plugin_jar()


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> tuple[dict, Path]:
    """One local-cluster application runs both checks (its executors take a while to start): results, runtime."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.jars {_jar()}\n"
        "spark.plugins org.sparkflow.exchange.ExchangePlugin\n"
        f"spark.pyspark.python {sys.executable}\n"
        "spark.ui.enabled false\n"
        "spark.task.maxFailures 2\n"
        "spark.sparkflow.exchange.serviceScope executor\n")
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARK_CONF_DIR": str(conf), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime)}
    proc = subprocess.run([sys.executable, str(HERE / "app_cluster.py")], capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    # the plugin's launcher calls (the real launcher's answers) end without a warning of ours
    assert "sparkflow-exchange:" not in proc.stderr, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), runtime


def _services_gone(runtime: Path, services: list[dict], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    pids = [s["pid"] for s in services]
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.3)
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"service processes still running after the application ended: {alive}"
    for s in services:
        assert not Path(s["spill_dir"]).exists(), f"spill directory {s['spill_dir']} left behind"


def _result(cluster_run, check: str) -> dict:
    result = cluster_run[0][check]
    assert "failed" not in result, result["failed"]
    return result


def test_hash_exchange_over_two_executors_is_exact_and_uses_local_and_remote_channels(cluster_run):
    result = _result(cluster_run, "exact")
    assert result["ok"] and result["services"] == 2
    local = sum(t["local"] + t["local_file"] for t in result["traffic"])
    remote = sum(t["remote"] for t in result["traffic"])
    assert local > 0, result
    assert remote > 0, result


def test_killed_service_fails_the_read_naming_it_and_nothing_remains(cluster_run):
    result, runtime = _result(cluster_run, "kill"), cluster_run[1]
    assert result["error"], "the read did not fail although a service holding its partitions was killed"
    assert result["victim"] in result["error"] or result["victim_unix"] in result["error"], result["error"][:2000]
    # nothing arrives from the killed service: with readerTimeout 900 s, failing well before that is the
    # service's loss detected, on a loaded machine too
    assert result["failed_after"] < 300, result["failed_after"]
    _services_gone(runtime, result["services"])
