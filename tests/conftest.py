"""Shared fixtures: one SparkSession per test session, real services on loopback."""
from __future__ import annotations

import os
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

    from sparkflow_exchange.session_tuning import PYTHON_WORKER_UNIX_SOCKETS

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
