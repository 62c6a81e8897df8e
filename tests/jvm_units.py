"""Runs the plugin's sans-IO Java classes without Spark: ``jvm-stub/src/test/java/.../UnitDriver.java`` and the
probes beside it (one per package, in that package, so they reach its package-private classes), compiled against the
plugin jar and Spark's jars, answer one JSON request per line (see the driver's javadoc). One JVM serves a whole test
module, request by request, so its start and Spark's classes are paid once; no SparkSession is made."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable

# a short run: the quick compiler alone and the serial collector start a loaded 2-core machine's JVM 2-3 times faster
JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
# Arrow's direct memory needs what Spark's launcher gives every Spark JVM (JavaModuleOptions)
ARROW_FLAGS = ("--add-opens=java.base/java.nio=ALL-UNNAMED", "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED")
TEST_SOURCES = Path(__file__).resolve().parent.parent / "jvm-stub" / "src" / "test" / "java"
ANSWER_TIMEOUT = 120.0  # seconds one request may take, class loading included


class UnitDriver:
    """The driver's JVM, started at the first request (again if it ended), fed one request at a time; each answer
    is waited for up to ANSWER_TIMEOUT, after which the JVM is killed and the test fails saying so."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.proc: subprocess.Popen | None = None
        self.stderr = tempfile.TemporaryFile()  # a chatty JVM cannot block on a full pipe
        self.pending = b""
        weakref.finalize(self, UnitDriver._stop, self.__dict__)

    def __call__(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self.stderr)
            self.pending = b""
        answers = []
        for request in requests:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            answers.append(self._answer(time.monotonic() + ANSWER_TIMEOUT))
        return answers

    def _answer(self, deadline: float) -> dict[str, Any]:
        while True:
            line, newline, rest = self.pending.partition(b"\n")
            if newline:
                self.pending = rest
                if line.startswith(b"{"):
                    return json.loads(line)
                continue
            fd = self.proc.stdout.fileno()
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()
                raise AssertionError(f"the unit driver gave no answer in {ANSWER_TIMEOUT:.0f} s{self._said()}")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise AssertionError(f"the unit driver exited (code {self.proc.wait(10)}){self._said()}")
            self.pending += chunk

    def _said(self) -> str:
        self.stderr.seek(0)
        return "; its stderr ends:\n" + self.stderr.read()[-4000:].decode(errors="replace")

    @staticmethod
    def _stop(state: dict) -> None:
        proc = state.get("proc")
        if proc is not None and proc.poll() is None:
            proc.stdin.close()  # the driver ends at the end of its input
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        state["stderr"].close()


def compile_driver(jar: Path, out: Path) -> Callable[[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Compile the driver and its probes into ``out``; a function that sends requests to the driver's JVM and
    returns its answers."""
    from sparkflow_exchange.build_plugin import spark_jars

    classpath = ":".join([str(jar), *(str(p) for p in spark_jars())])
    proc = subprocess.run([shutil.which("javac") or "javac", *(f"-J{flag}" for flag in JVM_FLAGS), "--release", "17",
                           "-nowarn", "-cp", classpath, "-d", str(out), *map(str, sorted(TEST_SOURCES.rglob("*.java")))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return UnitDriver(["java", *JVM_FLAGS, *ARROW_FLAGS, "-cp", f"{out}:{classpath}", "org.sparkflow.exchange.UnitDriver"])
