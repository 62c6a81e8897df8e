"""Whole Spark applications in their own processes: two apps meeting at an exchange, spark-defaults.conf,
and the embedded service leaving nothing behind once the application has ended."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harness import stop_embedded

from sparkflow_exchange.service.spill_root import SPILL_PREFIX

pytestmark = pytest.mark.spark
ROOT = Path(__file__).parent.parent


def test_an_exchange_outlives_its_writer_application_for_a_reader_that_starts_later(tmp_path):
    """examples/two_applications.py: the writer application ends, the reader starts after a gap four times
    ``embedded.idleTimeout`` (the idle timer that used to end the service and its exchange with it) and
    reads every row from the same service; once it dropped the exchange the service exits, leaving nothing."""
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime),
           "SPARKFLOW_EXCHANGE_CONF": json.dumps({"embedded.idleTimeout": "1s"})}
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / "two_applications.py"), "--gap", "4"],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "two applications OK" in proc.stdout
        [written] = [line for line in proc.stdout.splitlines() if line.startswith("producer: committed")]
        [read] = [line for line in proc.stdout.splitlines() if line.startswith("consumer: ")]
        assert read.startswith("consumer: 500000 rows"), read
        pid = int(written.rsplit("pid ", 1)[1].rstrip(")"))
        assert read.endswith(f"(exchange service pid {pid})"), (written, read)  # one service, alive through the gap
        _gone(pid, runtime)
    finally:
        stop_embedded(runtime)  # nothing to do when it exited by itself; ends it when a step above failed


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
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rows"] == 100
    assert result["from_file"] == ["BLOCKING", 3]
    assert result["overridden"] == ["HYBRID", 5]
    # the application has ended and dropped its exchanges: the embedded service exits and removes its files
    _gone(result["service_pid"], runtime, Path(result["spill_dir"]))


def _gone(pid: int, runtime: Path, spill: Path | None = None) -> None:
    """The embedded service ``pid`` exits (within a generous bound) and leaves no file behind."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "embedded service still running after its application ended"
    assert spill is None or not spill.exists(), f"spill directory {spill} left behind"
    assert not list(Path(tempfile.gettempdir()).glob(f"{SPILL_PREFIX}{pid}-*")), "spill directory left behind"
    assert sorted(p.name for p in runtime.iterdir()) == [], "files left in the runtime directory"
