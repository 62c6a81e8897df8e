"""Runs the plugin's sans-IO Java classes without Spark: ``jvm-stub/src/test/java/.../UnitDriver.java`` and the
probes beside it (one per package, in that package, so they reach its package-private classes), compiled against the
plugin jar and Spark's jars, answer one JSON request per line (see the driver's javadoc). A JVM start and a few
requests take a second or two; no SparkSession is made."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

# a short run: the quick compiler alone and the serial collector start a loaded 2-core machine's JVM 2-3 times faster
JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
TEST_SOURCES = Path(__file__).resolve().parent.parent / "jvm-stub" / "src" / "test" / "java"


def compile_driver(jar: Path, out: Path) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Compile the driver and its probes into ``out``; a function that sends requests to one JVM run and returns its
    answers."""
    from sparkflow_exchange.build_plugin import spark_jars

    classpath = ":".join([str(jar), *(str(p) for p in spark_jars())])
    proc = subprocess.run([shutil.which("javac") or "javac", *(f"-J{flag}" for flag in JVM_FLAGS), "--release", "17", "-nowarn", "-cp", classpath, "-d", str(out),
                           *map(str, sorted(TEST_SOURCES.rglob("*.java")))], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]

    def run(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        proc = subprocess.run(["java", *JVM_FLAGS, "-cp", f"{out}:{classpath}", "org.sparkflow.exchange.UnitDriver"],
                              input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-4000:]
        answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert len(answers) == len(requests), proc.stdout[-2000:] + proc.stderr[-2000:]
        return answers
    return run
