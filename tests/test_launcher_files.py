"""The Spark plugin's launcher call leaves no files behind, even when its JVM is killed while the launcher
runs (an executor ended during its plugin's shutdown, which runs the detach launcher)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
JAR = TESTS.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"

KILLED_MID_LAUNCH = r"""
import org.apache.spark.SparkConf;

public class KilledMidLaunch {
    public static void main(String[] args) {
        org.sparkflow.exchange.Launcher.embeddedService(new SparkConf(false).set("spark.pyspark.python", args[0]));
    }
}
"""


def test_a_jvm_killed_while_the_launcher_runs_leaves_no_files(tmp_path):
    if shutil.which("java") is None:
        pytest.skip("no java on PATH")
    if not JAR.exists():
        pytest.skip("the plugin jar is not built (jvm-stub/build.py)")
    import pyspark

    started = tmp_path / "launcher.pid"
    launcher = tmp_path / "python"  # a launcher that is slow to answer: it is running when the JVM dies
    launcher.write_text(f"#!/bin/sh\necho $$ > {started}.tmp && mv {started}.tmp {started}\nexec sleep 120\n")
    launcher.chmod(0o755)
    java_tmp = tmp_path / "java-tmp"
    java_tmp.mkdir()
    source = tmp_path / "KilledMidLaunch.java"
    source.write_text(KILLED_MID_LAUNCH)
    classpath = f"{JAR}:{Path(pyspark.__file__).parent / 'jars'}/*"
    jvm = subprocess.Popen(["java", f"-Djava.io.tmpdir={java_tmp}", "-cp", classpath, str(source), str(launcher)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.monotonic() + 180  # compiling the source and starting the JVM, on a loaded machine
        while not started.exists():
            assert jvm.poll() is None, jvm.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the launcher was never started"
            time.sleep(0.1)
        child = int(started.read_text())
        os.kill(jvm.pid, signal.SIGKILL)
        jvm.wait(30)
        assert not list(java_tmp.glob("sparkflow-plugin-*")), sorted(p.name for p in java_tmp.iterdir())
    finally:
        if jvm.poll() is None:
            jvm.kill()
            jvm.wait(30)
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
