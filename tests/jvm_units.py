"""Runs the plugin's sans-IO Java classes without Spark: ``jvm-stub/src/test/java/.../UnitDriver.java``, compiled
against the plugin jar and Spark's jars, answers one JSON request per line (see its javadoc). A JVM start and a
few requests take a second or two; no SparkSession is made."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

DRIVER = Path(__file__).resolve().parent.parent / "jvm-stub" / "src" / "test" / "java" / "org" / "sparkflow" / "exchange" / "UnitDriver.java"


def compile_driver(jar: Path, out: Path) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Compile the driver into ``out``; a function that sends requests to one JVM run and returns its answers."""
    from sparkflow_exchange.build_plugin import spark_jars

    classpath = ":".join([str(jar), *(str(p) for p in spark_jars())])
    proc = subprocess.run([shutil.which("javac") or "javac", "--release", "17", "-nowarn", "-cp", classpath, "-d", str(out),
                           str(DRIVER)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]

    def run(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Arrow's direct memory needs what Spark's launcher gives every Spark JVM (JavaModuleOptions)
        proc = subprocess.run(["java", "--add-opens=java.base/java.nio=ALL-UNNAMED",
                               "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED", "-cp", f"{out}:{classpath}",
                               "org.sparkflow.exchange.UnitDriver"],
                              input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-4000:]
        answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert len(answers) == len(requests), proc.stdout[-2000:] + proc.stderr[-2000:]
        return answers
    return run
