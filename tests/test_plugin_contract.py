"""The Java plugin (jvm-stub/) against its contract, with a FAKE launcher and a real Spark.

``spark.pyspark.python`` points at a temporary shell script, so the plugin runs
``<script> -m sparkflow_exchange.service.plugin <role> ...``; the script records its
arguments and ``SPARKFLOW_EXCHANGE_CONF`` and answers like the real launcher. Only a
JVM-side action runs (``spark.range(10).count()``): Python workers would use the
fake interpreter too. Each application runs in its own Python process (its own JVM),
independent of the session-wide ``spark`` fixture. Takes ~15-25 s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_app_with_jar

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

WEIRD = 'a"b\\c\td\x01é'  # needs every kind of escaping on its way through the JSON env var

RECORDER = r'''
import json, os, sys
calls = sys.argv[1]
argv = sys.argv[2:]
with open(calls, "a") as f:
    f.write(json.dumps({"argv": argv, "conf": os.environ.get("SPARKFLOW_EXCHANGE_CONF")}) + "\n")
sys.stderr.write("fake launcher noise\n" * 20000)  # ~400 KB: a pipe would fill and block
role = argv[2] if len(argv) > 2 else ""
fail = os.environ.get("FAKE_LAUNCHER_FAIL", "")
if fail and role == fail:
    sys.stderr.write("fake-launcher-boom-marker\n")
    sys.exit(3)
print("not json: a log line before the answer")
if role == "driver":
    print(json.dumps({"coordinator": "127.0.0.1:1", "secret": "s", "host_id": "fake", "extra": {"a": [1, None]}}))
else:  # nested values, as the real launcher's detach answers (the files it swept)
    print(json.dumps({"ok": True, "role": role, "swept": ["/tmp/x"], "service": {"pid": 1, "tls": False}}))
'''

APP = r'''
import json, os, sys, time
from pyspark.sql import SparkSession
calls, jar, script, master = sys.argv[1:5]
builder = (SparkSession.builder.master(master).appName("plugin-contract")
           .config("spark.jars", jar)
           .config("spark.plugins", "org.sparkflow.exchange.ExchangePlugin")
           .config("spark.pyspark.python", script)
           .config("spark.ui.enabled", "false")
           .config("spark.sparkflow.exchange.weird", os.environ["WEIRD_VALUE"])
           .config("spark.sparkflow.exchange.serviceScope", "executor"))
try:
    spark = builder.getOrCreate()
except Exception as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
jvm = spark.sparkContext._jvm
out = {"count": spark.range(10).count(),
       "driver_pid": jvm.java.lang.ProcessHandle.current().pid(),
       "app_id": spark.sparkContext.applicationId}
spark.stop()
deadline = time.monotonic() + 10  # an executor's plugin shutdown runs as the executor is stopped
while time.monotonic() < deadline:
    roles = [json.loads(l)["argv"][2] for l in open(calls)]
    if roles.count("detach") >= 2:
        break
    time.sleep(0.2)
print(json.dumps(out))
'''


def _run_app(tmp_path: Path, jar: Path, master: str, fail: str = "") -> tuple[dict, list[dict], str]:
    calls = tmp_path / "calls.jsonl"
    calls.touch()
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    script = tmp_path / "fake-python.sh"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{recorder}" "{calls}" "$@"\n')
    script.chmod(0o755)
    app = tmp_path / "app.py"
    app.write_text(APP)
    conf_dir = tmp_path / "spark-conf"  # no spark-defaults.conf from the environment
    conf_dir.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONF_DIR": str(conf_dir), "WEIRD_VALUE": WEIRD, "FAKE_LAUNCHER_FAIL": fail}
    proc = subprocess.run([sys.executable, str(app), str(calls), str(jar), str(script), master],
                          capture_output=True, text=True, timeout=600, env=env)  # a bound for a hang (local-cluster under load)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    recorded = [json.loads(line) for line in calls.read_text().splitlines()]
    return result, recorded, proc.stderr


def _opt(argv: list[str], name: str) -> str:
    assert name in argv, argv
    return argv[argv.index(name) + 1]


def test_driver_executor_and_detach_calls_follow_the_contract(tmp_path, jar):
    result, calls, stderr = _run_app(tmp_path, jar, "local-cluster[1,1,1024]")
    assert result.get("count") == 10, result
    assert all(c["argv"][:2] == ["-m", "sparkflow_exchange.service.plugin"] for c in calls), calls
    by_role: dict[str, list[dict]] = {}
    for c in calls:
        by_role.setdefault(c["argv"][2], []).append(c)
    driver_pid = str(result["driver_pid"])

    # driver: its JVM's pid, an application id, every spark.sparkflow.exchange.* setting stripped
    [driver] = by_role["driver"]
    assert _opt(driver["argv"], "--jvm-pid") == driver_pid
    assert _opt(driver["argv"], "--app-id")
    conf = json.loads(driver["conf"])
    assert conf == {"weird": WEIRD, "serviceScope": "executor"}, conf

    # executor: its own JVM, its id, the settings plus the coordinator and secret the driver got
    [executor] = by_role["executor"]
    assert _opt(executor["argv"], "--executor-id") == "0"
    assert _opt(executor["argv"], "--jvm-pid") not in ("", driver_pid)
    conf = json.loads(executor["conf"])
    assert conf == {"weird": WEIRD, "serviceScope": "executor", "coordinator": "127.0.0.1:1", "secret": "s"}, conf

    # detach after spark.stop(): the driver's for sure, the executor's when it shut down cleanly
    detached = [_opt(c["argv"], "--jvm-pid") for c in by_role.get("detach", [])]
    assert driver_pid in detached, calls
    assert set(detached) <= {driver_pid, _opt(executor["argv"], "--jvm-pid")}, calls
    assert [c["argv"][2] for c in calls].index("detach") > [c["argv"][2] for c in calls].index("executor")
    # answers with nested values are read, so the application ends without a warning of ours
    assert "sparkflow-exchange" not in stderr, stderr[-3000:]


def test_failing_driver_launcher_fails_the_context_with_its_stderr(tmp_path, jar):
    result, calls, _ = _run_app(tmp_path, jar, "local[1]", fail="driver")
    assert "error" in result, result
    assert "fake-launcher-boom-marker" in result["error"], result["error"][-3000:]
    assert "exit 3" in result["error"], result["error"][-3000:]
    assert [c["argv"][2] for c in calls] == ["driver"], calls


REAL_APP = r'''
import json, subprocess, sys
import sparkflow_exchange
from pyspark.sql import SparkSession
from sparkflow_exchange.service.discovery import runtime_dir
jar = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("plugin-real-launcher")
         .config("spark.jars", jar).config("spark.plugins", "org.sparkflow.exchange.ExchangePlugin")
         .config("spark.pyspark.python", sys.executable).config("spark.ui.enabled", "false").getOrCreate())
spark.range(0, 100, 1, 2).write.format("pipelined").mode("overwrite").option("exchange", "via-plugin") \
    .option("keys", "id").option("numSubpartitions", "2").save()
# the driver's helpers ask the plugin's coordinator (found through the session's JVM), never a new service
listed = [e.name for e in sparkflow_exchange.list_exchanges(spark)]
status = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--json"], capture_output=True,
                        text=True, timeout=600)  # the CLI on this host sees the plugin's services
seen = sorted(s["service"]["started_by"] for s in json.loads(status.stdout or "[]")) or status.stderr
dropped = sparkflow_exchange.drop_exchange("via-plugin", spark=spark)
print(json.dumps({"listed": listed, "dropped": dropped, "seen": seen,
                  "embedded": (runtime_dir() / "embedded.json").exists()}))
spark.stop()
'''


def test_an_application_with_the_real_launcher_finds_its_coordinator_and_ends_without_a_warning(tmp_path, jar):
    result, proc = run_app_with_jar(tmp_path, REAL_APP, jar)
    assert result == {"listed": ["via-plugin"], "dropped": {"dropped": "via-plugin", "partitions": 2},
                      "seen": ["plugin coordinator", "plugin service"], "embedded": False}, result
    # the launcher's detach answers with nested JSON (the files it swept); the plugin reads it quietly
    assert "sparkflow-exchange" not in proc.stderr, proc.stderr[-5000:]
