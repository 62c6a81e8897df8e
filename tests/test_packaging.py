"""The package as users install it: a wheel with the plugin jar, a pure-Python wheel without a JDK
that names the command building the jar, the sdist with jvm-stub/, and an editable install (README
set-up) that Spark finds from any working directory.

Wheels are built from a clean copy of the tree (the files git would commit, nothing ignored: no jar,
no build/) without build isolation, so pyspark (a build requirement) is not fetched again.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from harness import stop_embedded

pytestmark = pytest.mark.packaging
ROOT = Path(__file__).resolve().parent.parent
JAR_IN_WHEEL = "sparkflow_exchange/jars/sparkflow-exchange-plugin.jar"
PLUGIN_CLASS = "org/sparkflow/exchange/ExchangePlugin.class"
CONTRACT_CLASS = "org/sparkflow/exchange/contract/Contract.class"  # generated from contract.json at the build


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    dest = tmp_path_factory.mktemp("clean") / "src"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    assert not (dest / JAR_IN_WHEEL).exists()
    return dest


def build_wheel(clean: Path, tmp: Path, env: dict | None = None) -> tuple[Path, str]:
    """Build from a fresh copy of the clean tree (a build leaves build/ behind, jar included)."""
    src, out = tmp / "src", tmp / "dist"
    shutil.copytree(clean, src)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-v",
                           "-w", str(out)], cwd=src, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheels = list(out.glob("sparkflow_exchange-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], proc.stdout + proc.stderr


def installed_python(wheel: Path, target: Path, code: str, **env_changes: str) -> subprocess.CompletedProcess:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target), **env_changes}
    return subprocess.run([sys.executable, "-c", code], cwd=target.parent, capture_output=True, text=True, env=env,
                          timeout=300)


def test_wheel_carries_the_plugin_jar_and_plugin_jar_returns_it(clean_copy, tmp_path):
    wheel, _ = build_wheel(clean_copy, tmp_path)
    with zipfile.ZipFile(wheel) as whl:
        jar_bytes = whl.read(JAR_IN_WHEEL)
        assert "sparkflow_exchange/contract.json" in whl.namelist()  # Python reads it; an installed build makes Java's
    (tmp_path / "p.jar").write_bytes(jar_bytes)
    assert {PLUGIN_CLASS, CONTRACT_CLASS} <= set(zipfile.ZipFile(tmp_path / "p.jar").namelist())
    # Spark finds format("pipelined") in the jar through this service entry
    services = zipfile.ZipFile(tmp_path / "p.jar").read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister")
    assert services.decode().split() == ["org.sparkflow.exchange.format.PipelinedFormat"]
    site = tmp_path / "site"
    proc = installed_python(wheel, site, "import sparkflow_exchange as s; print(s.plugin_jar())")
    assert proc.returncode == 0, proc.stderr
    jar = Path(proc.stdout.strip())
    assert jar == site / JAR_IN_WHEEL
    assert PLUGIN_CLASS in zipfile.ZipFile(jar).namelist()


def test_without_a_jdk_the_wheel_is_pure_python_and_names_a_command_that_builds_the_jar(clean_copy, tmp_path):
    no_jdk = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # python, no javac
    wheel, log = build_wheel(clean_copy, tmp_path, env=no_jdk)
    assert "building WITHOUT the Spark plugin jar" in log and "javac" in log
    assert JAR_IN_WHEEL not in zipfile.ZipFile(wheel).namelist()
    site = tmp_path / "site"
    proc = installed_python(wheel, site, "import sparkflow_exchange as s; s.plugin_jar()")
    assert proc.returncode != 0 and "python -m sparkflow_exchange.build_plugin" in proc.stderr, proc.stderr
    # the command exists and works from the installed package, with a JDK
    env = {**os.environ, "PYTHONPATH": str(site)}
    built = subprocess.run([sys.executable, "-m", "sparkflow_exchange.build_plugin"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert {PLUGIN_CLASS, CONTRACT_CLASS} <= set(zipfile.ZipFile(site / JAR_IN_WHEEL).namelist())


def test_sdist_carries_the_java_sources_and_the_build_hook(clean_copy, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(clean_copy, src)
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                           "print(b.build_sdist(sys.argv[1]))", str(tmp_path / "sdist")], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tarfile.open(tmp_path / "sdist" / proc.stdout.strip().splitlines()[-1]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "MANIFEST.in", "sparkflow_exchange/build_plugin.py", "jvm-stub/build.py",
            "jvm-stub/src/main/java/org/sparkflow/exchange/ExchangePlugin.java",
            "sparkflow_exchange/contract.json"} <= names


FROM_ELSEWHERE = r'''
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.range(0, 30, 1, 2).write.format("pipelined").mode("overwrite").option("exchange", "anywhere") \
    .option("keys", "id").option("numSubpartitions", "2").save()
print("rows", spark.read.format("pipelined").option("exchange", "anywhere").load().count())
spark.stop()
'''


@pytest.mark.spark
def test_editable_install_is_found_by_spark_from_any_directory(tmp_path):
    """The README's set-up (scripts/setup.sh: compat editable mode); no register, cwd outside the project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = str(tmp_path / "runtime")
    try:
        proc = subprocess.run([sys.executable, "-c", FROM_ELSEWHERE], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        stop_embedded(tmp_path / "runtime")  # it keeps the application's exchanges for later readers
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows 30" in proc.stdout
