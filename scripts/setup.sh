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
# the package's build tools, in the venv: the editable install below builds without isolation
# (an isolated build would fetch pyspark a second time, ~400 MB) and tests build wheels the same way
.venv/bin/python -m pip install -q 'setuptools>=68' wheel 2>&1 | grep -v -E '^(WARNING|  |$)' || true
# compat editable mode: the project root goes on sys.path through a .pth file, so Spark's pkgutil
# scan finds pyspark_pipelined (format("pipelined")) from any working directory; setuptools' default
# editable finder is invisible to pkgutil
.venv/bin/python -m pip install -q --no-build-isolation -e '.[test]' --config-settings editable_mode=compat \
  2>&1 | grep -v -E '^(WARNING|  |$)' || true
# the torch tests (sparkflow_exchange.torch): the CPU build, ~105 s and ~750 MB measured on the 2-core machine
# (the '.[torch]' extra pins the same version; an unpinned torch would pull a multi-GB CUDA build)
if [ "${SPARKFLOW_SKIP_TORCH:-0}" != 1 ]; then
  .venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v -E '^(WARNING|  |$)' || true
fi
.venv/bin/python -c "import sparkflow_exchange, pyspark, pyarrow, chispa, grpc" 
if [ -d jvm-stub ] && [ -f jvm-stub/build.py ]; then
  .venv/bin/python jvm-stub/build.py
fi
