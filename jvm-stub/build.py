"""Build the Spark plugin jar of a source checkout: sparkflow_exchange/jars/sparkflow-exchange-plugin.jar.

The builder is ``sparkflow_exchange/build_plugin.py`` (also run by the package build and by
``python -m sparkflow_exchange.build_plugin``); loaded by path so it runs before the package is installed.
Skips when the jar is newer than every source. Prints one line saying what it did; exits 1 with a message
if javac is missing, Spark's jars cannot be found, or javac fails.
Run: .venv/bin/python jvm-stub/build.py   (scripts/setup.sh does)
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BUILDER = Path(__file__).resolve().parent.parent / "sparkflow_exchange" / "build_plugin.py"


def main() -> int:
    spec = importlib.util.spec_from_file_location("_sparkflow_build_plugin", BUILDER)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    try:
        print(builder.build(builder.DEFAULT_JAR, builder.CHECKOUT_SOURCES))
    except builder.BuildError as exc:
        print(f"jvm-stub/build.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
