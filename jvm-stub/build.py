"""Build the Spark plugin jar with javac against the jars inside the pyspark wheel (no Maven).

Writes sparkflow_exchange/jars/sparkflow-exchange-plugin.jar; skips when the jar is newer than every
source (the .java files and this script). Prints one line saying what it did.
Run: .venv/bin/python jvm-stub/build.py   (scripts/setup.sh does)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_ROOT = HERE / "src" / "main" / "java"
JAR = HERE.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"
MANIFEST = ("Manifest-Version: 1.0\r\n"
            "Created-By: sparkflow-exchange jvm-stub/build.py\r\n"
            "Implementation-Title: sparkflow-exchange-plugin\r\n"
            "\r\n")


def fail(message: str) -> int:
    print(f"jvm-stub/build.py: {message}", file=sys.stderr)
    return 1


def pyspark_jars() -> list[Path]:
    import pyspark  # ImportError handled by the caller

    jars_dir = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    return sorted(Path(jars_dir).glob("*.jar"))


def main() -> int:
    sources = sorted(SOURCE_ROOT.rglob("*.java"))
    if not sources:
        return fail(f"no Java sources under {SOURCE_ROOT}")
    inputs = [*sources, Path(__file__).resolve()]
    if JAR.exists() and all(JAR.stat().st_mtime_ns > s.stat().st_mtime_ns for s in inputs):
        print(f"plugin jar up to date, not rebuilt: {JAR.relative_to(HERE.parent)}")
        return 0
    javac = shutil.which("javac")
    if javac is None:
        return fail("javac (JDK 17 or newer) is not on PATH; cannot build the Spark plugin jar")
    try:
        jars = pyspark_jars()
    except ImportError as e:
        return fail(f"pyspark is not importable by {sys.executable} ({e}); run this with the project's virtualenv")
    if not jars:
        return fail("the pyspark installation has no jars/ directory with jars to compile against")
    with tempfile.TemporaryDirectory(prefix="sparkflow-jvm-stub-") as out:
        proc = subprocess.run([javac, "--release", "17", "-nowarn", "-encoding", "UTF-8",
                               "-cp", os.pathsep.join(map(str, jars)), "-d", out, *map(str, sources)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout + proc.stderr)
            return fail(f"javac failed (exit {proc.returncode}); the jar was not written")
        classes = sorted(Path(out).rglob("*.class"))
        JAR.parent.mkdir(parents=True, exist_ok=True)
        tmp = JAR.with_name(JAR.name + f".{os.getpid()}.tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", MANIFEST)
                for cls in classes:
                    jar.write(cls, cls.relative_to(out).as_posix())
            tmp.replace(JAR)
        finally:
            tmp.unlink(missing_ok=True)
    print(f"built {JAR.relative_to(HERE.parent)} ({len(classes)} classes from {len(sources)} sources)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
