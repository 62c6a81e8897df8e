"""Whole Spark applications in their own processes: two apps meeting at an exchange, spark-defaults.conf,
and the embedded service leaving nothing behind once the application has ended."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).parent.parent


def test_two_applications_meet_at_an_exchange_name():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "two_applications.py")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "consumer: 500000 rows" in proc.stdout
    assert "two applications OK" in proc.stdout


def test_spark_defaults_conf_reaches_the_source_and_embedded_service_cleans_up(tmp_path):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.ui.enabled false\n"
        "spark.sparkflow.exchange.partitionType   BLOCKING\n"
        "spark.sparkflow.exchange.numSubpartitions 3\n"
        "spark.sparkflow.exchange.embedded.idleTimeout 1s\n")
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime)}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "app_config_check.py")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 100
    assert result["from_file"] == ["BLOCKING", 3]
    assert result["overridden"] == ["HYBRID", 5]
    # the application has ended: its embedded service exits and removes its socket and spill files
    pid, spill, sock = result["service_pid"], Path(result["spill_dir"]), result["socket"].removeprefix("unix:")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "embedded service still running after its application ended"
    assert not spill.exists(), f"spill directory {spill} left behind"
    assert not Path(sock).exists(), f"socket {sock} left behind"
    assert not (runtime / "embedded.json").exists()
