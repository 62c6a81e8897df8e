"""Package build hook: compile the Spark plugin (jvm-stub/) into the wheel.

Everything else is in pyproject.toml. ``build_py`` runs setuptools' own step, then
``sparkflow_exchange/build_plugin.py`` (javac against pyspark's jars, a build requirement)
writes ``sparkflow_exchange/jars/sparkflow-exchange-plugin.jar`` into the build, and the Java
sources go along (``sparkflow_exchange/jvm_src``) so an installed package can build the jar
later. Without a JDK the build says what is missing and the wheel is pure Python.
"""
import importlib.util
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCES = ROOT / "jvm-stub" / "src" / "main" / "java"


def _builder():
    spec = importlib.util.spec_from_file_location("_sparkflow_build_plugin", ROOT / "sparkflow_exchange" / "build_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithPlugin(build_py):
    def run(self) -> None:
        super().run()
        if not SOURCES.is_dir():
            print("sparkflow-exchange: no jvm-stub/ sources here; the package is built without the Spark plugin jar",
                  file=sys.stderr)
            return
        editable = getattr(self, "editable_mode", False)
        package = ROOT / "sparkflow_exchange" if editable else Path(self.build_lib) / "sparkflow_exchange"
        if not editable:
            shutil.copytree(SOURCES, package / "jvm_src", dirs_exist_ok=True)
        builder = _builder()
        try:
            print(f"sparkflow-exchange: {builder.build(package / 'jars' / builder.JAR_NAME, SOURCES)}")
        except builder.BuildError as exc:
            print(f"sparkflow-exchange: WARNING: building WITHOUT the Spark plugin jar (needed only on a cluster): "
                  f"{exc}. Later, with a JDK: python -m sparkflow_exchange.build_plugin", file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWithPlugin})
