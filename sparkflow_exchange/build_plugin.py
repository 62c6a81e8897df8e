"""Build the Spark plugin jar with javac against the jars inside the pyspark wheel (no Maven).

One builder for every route to the jar: the package build (``setup.py`` puts the jar in the wheel),
``jvm-stub/build.py`` (a source checkout) and ``python -m sparkflow_exchange.build_plugin`` (an
installed package whose wheel was built without a JDK: the wheel carries the Java sources).
Standard library only: ``setup.py`` loads this file by path, before the package is installed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

JAR_NAME = "sparkflow-exchange-plugin.jar"
PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_SOURCES = PACKAGE_DIR / "jvm_src"  # the Java sources as the wheel carries them
CHECKOUT_SOURCES = PACKAGE_DIR.parent / "jvm-stub" / "src" / "main" / "java"  # a source checkout
DEFAULT_JAR = PACKAGE_DIR / "jars" / JAR_NAME
MANIFEST = ("Manifest-Version: 1.0\r\n"
            "Created-By: sparkflow-exchange build_plugin\r\n"
            "Implementation-Title: sparkflow-exchange-plugin\r\n"
            "\r\n")
# Service registrations written into the jar when their class was compiled: Spark's DataSourceRegister makes
# format("pipelined") the JVM provider's (org.sparkflow.exchange.format.PipelinedFormat) where the jar is loaded.
SERVICES = {"META-INF/services/org.apache.spark.sql.sources.DataSourceRegister":
            "org.sparkflow.exchange.format.PipelinedFormat"}


class BuildError(RuntimeError):
    """The jar cannot be built here; the message says what is missing."""


def default_sources() -> Path:
    """The Java sources: the checkout's jvm-stub/ when there is one, else the copy inside the package."""
    for root in (CHECKOUT_SOURCES, PACKAGED_SOURCES):
        if any(root.rglob("*.java")):
            return root
    raise BuildError(f"no Java sources under {CHECKOUT_SOURCES} or {PACKAGED_SOURCES}")


def spark_jars() -> list[Path]:
    """The jars to compile against: pyspark's own (``<pyspark>/jars``), else ``$SPARK_HOME/jars``."""
    candidates = []
    try:
        import pyspark

        candidates.append(Path(pyspark.__file__).parent / "jars")
    except ImportError:
        pass
    if os.environ.get("SPARK_HOME"):
        candidates.append(Path(os.environ["SPARK_HOME"]) / "jars")
    for directory in candidates:
        jars = sorted(directory.glob("*.jar"))
        if jars:
            return jars
    raise BuildError(f"no Spark jars to compile against: pyspark is not importable by {sys.executable} "
                     "and $SPARK_HOME/jars is not set or empty")


def up_to_date(jar: Path, sources: Path) -> bool:
    inputs = [*sources.rglob("*.java"), Path(__file__).resolve()]
    return jar.exists() and all(jar.stat().st_mtime_ns > s.stat().st_mtime_ns for s in inputs)


def build(jar: Path = DEFAULT_JAR, sources: Path | None = None, *, force: bool = False) -> str:
    """Compile ``sources`` into ``jar`` (skipped when it is newer than every source); returns what it did."""
    sources = sources or default_sources()
    java_files = sorted(sources.rglob("*.java"))
    if not java_files:
        raise BuildError(f"no Java sources under {sources}")
    if not force and up_to_date(jar, sources):
        return f"plugin jar up to date, not rebuilt: {jar}"
    javac = shutil.which("javac")
    if javac is None:
        raise BuildError("javac (JDK 17 or newer) is not on PATH; cannot build the Spark plugin jar")
    classpath = os.pathsep.join(map(str, spark_jars()))
    with tempfile.TemporaryDirectory(prefix="sparkflow-jvm-stub-") as out:
        proc = subprocess.run([javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", classpath,
                               "-d", out, *map(str, java_files)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"javac failed (exit {proc.returncode}); the jar was not written:\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
        classes = sorted(Path(out).rglob("*.class"))
        jar.parent.mkdir(parents=True, exist_ok=True)
        tmp = jar.with_name(f"{jar.name}.{os.getpid()}.tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
                archive.writestr("META-INF/MANIFEST.MF", MANIFEST)
                for cls in classes:
                    archive.write(cls, cls.relative_to(out).as_posix())
                for entry, provider in SERVICES.items():
                    if (Path(out) / (provider.replace(".", "/") + ".class")).exists():
                        archive.writestr(entry, provider + "\n")
            tmp.replace(jar)
        finally:
            tmp.unlink(missing_ok=True)
    return f"built {jar} ({len(classes)} classes from {len(java_files)} sources)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkflow_exchange.build_plugin", description=__doc__)
    parser.add_argument("--output", type=Path, default=DEFAULT_JAR, help=f"where to write the jar (default {DEFAULT_JAR})")
    parser.add_argument("--sources", type=Path, help="root of the Java sources (default: jvm-stub/ or the packaged copy)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the jar is up to date")
    args = parser.parse_args(argv)
    try:
        print(build(args.output, args.sources, force=args.force))
    except (BuildError, OSError) as exc:
        print(f"sparkflow_exchange.build_plugin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
