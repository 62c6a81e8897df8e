"""Build the Spark plugin jar with javac against the jars inside the pyspark wheel (no Maven).

Writes sparkflow_exchange/jars/sparkflow-exchange-plugin.jar; skips when it is newer than every source.
Run: .venv/bin/python jvm-stub/build.py
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
SOURCES = sorted((HERE / "src" / "main" / "java").rglob("*.java"))
JAR = HERE.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"


def main() -> int:
    if JAR.exists() and all(JAR.stat().st_mtime > s.stat().st_mtime for s in SOURCES):
        print(f"plugin jar up to date: {JAR}")
        return 0
    javac = shutil.which("javac")
    if javac is None:
        print("jvm-stub/build.py: javac (Java 17) is not on PATH; cannot build the Spark plugin", file=sys.stderr)
        return 1
    try:
        import pyspark
    except ImportError:
        print("jvm-stub/build.py: pyspark is not importable; run it with the project's virtualenv", file=sys.stderr)
        return 1
    jars = sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([javac, "--release", "17", "-nowarn", "-cp", os.pathsep.join(map(str, jars)), "-d", out,
                        *map(str, SOURCES)], check=True)
        JAR.parent.mkdir(parents=True, exist_ok=True)
        tmp = JAR.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: sparkflow-exchange jvm-stub/build.py\r\n\r\n")
            for cls in sorted(Path(out).rglob("*.class")):
                jar.write(cls, cls.relative_to(out).as_posix())
        tmp.replace(JAR)
    print(f"built {JAR} from {len(SOURCES)} sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
