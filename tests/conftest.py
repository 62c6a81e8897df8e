"""Shared fixtures: one SparkSession per test session, real services on loopback."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

# Workers must run the interpreter that has the project installed, find the tests'
# helper modules (custom partitioners, fault injection) and use a private runtime
# directory, so the embedded service of this test run is its own.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
RUNTIME_DIR = tempfile.mkdtemp(prefix="sparkflow-test-runtime-")
os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = RUNTIME_DIR
sys.path.insert(0, str(TESTS))


def pytest_sessionfinish(session, exitstatus):
    """The embedded service of this test run keeps its exchanges for later readers: end it with the run."""
    import shutil

    from harness import stop_embedded

    stop_embedded(Path(RUNTIME_DIR))
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def spark():
    """A local session shared by every Spark test (start-up costs ~6 s).

    ``local[4, 2]``: four task slots (a pipelined read and its write need slots
    at once) and two attempts per task, so fault tests see Spark's retry.
    """
    from pyspark.sql import SparkSession

    from sparkflow_exchange.spark.session_tuning import PYTHON_WORKER_UNIX_SOCKETS

    session = (
        SparkSession.builder.master("local[4, 2]")
        # one of the recommended SPARK_SETTINGS (the other, the Arrow batch check, is what test_session_tuning tests)
        .config(PYTHON_WORKER_UNIX_SOCKETS, "true")
        .appName("sparkflow-exchange-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.legacy.allowHashOnMapType", "true")  # chispa sorts rows by hashing map columns
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture
def tmp_service(tmp_path):
    """A real service process (with the coordinator role) on 127.0.0.1, stopped after the test."""
    from harness import start_service

    services = []

    def start(**kwargs):
        svc = start_service(tmp_path / f"svc{len(services)}", **kwargs)
        services.append(svc)
        return svc

    yield start
    for svc in services:
        svc.stop()


PLUGIN_BUILD = TESTS.parent / "jvm-stub" / "build.py"
PLUGIN_JAR = TESTS.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"


@pytest.fixture(scope="session")
def jar() -> Path:
    """The Spark plugin jar, built once per test session (skipped without javac)."""
    if shutil.which("javac") is None:
        pytest.skip("javac is not on PATH; the plugin jar cannot be built")
    proc = subprocess.run([sys.executable, str(PLUGIN_BUILD)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert PLUGIN_JAR.is_file()
    return PLUGIN_JAR


def run_app_with_jar(tmp_path: Path, source: str, jar: Path, defaults: str = "",
                     timeout: float = 400) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``source`` as a Spark application given the plugin jar (``defaults``: its spark-defaults.conf,
    none from the environment; its own runtime directory, ``tmp_path/runtime``); its last stdout line,
    parsed as JSON, and the process. ``timeout``: seconds the application may take in all."""
    app = tmp_path / "app.py"
    app.write_text(source)
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(defaults)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONF_DIR": str(conf_dir), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    proc = subprocess.run([sys.executable, str(app), str(jar)], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


@pytest.fixture(scope="session")
def jvm_write_and_catalog(tmp_path_factory, jar) -> dict:
    """The checks of tests/app_jvm_write.py and tests/app_jvm_catalog.py, run in one application
    (tests/app_jvm_write_and_catalog.py; a session start saved): check name -> outcome, for test_jvm_write.py and
    test_jvm_catalog.py."""
    from sparkflow_exchange.service.process import stop_embedded

    work = tmp_path_factory.mktemp("jvm-write-and-catalog")
    try:
        result, _proc = run_app_with_jar(work, (TESTS / "app_jvm_write_and_catalog.py").read_text(), jar,
                                         timeout=1800)
    finally:
        stop_embedded(work / "runtime")  # the application's service keeps its exchanges for later readers
    return result
