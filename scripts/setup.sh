#!/usr/bin/env bash
# Set up a development environment from nothing but Python 3.11 and Java 17:
# a virtualenv in .venv with the project and its test tools, and the Spark plugin jar.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[test]' 2>&1 | grep -v -E '^(WARNING|  |$)' || true
.venv/bin/python -c "import sparkflow_exchange, pyspark, pyarrow, chispa" 
if [ -d jvm-stub ] && [ -f jvm-stub/build.py ]; then
  .venv/bin/python jvm-stub/build.py
fi
