"""One Spark application for tests/test_jvm_write.py and tests/test_jvm_catalog.py, run with the plugin jar as
argv[1]: tests/app_jvm_write.py's checks, then tests/app_jvm_catalog.py's in the same session (local[2], the jar,
the exchange catalog), one session start for both. The JVM writes come first: their first check needs an application
in which no Python worker has run yet.
Prints one JSON line: check name -> {"ok": bool, "error": text, ...details}.
"""
from __future__ import annotations

import json
import runpy
from pathlib import Path

import app_checks
from app_checks import results

HERE = Path(app_checks.__file__).parent
for part in ("app_jvm_write", "app_jvm_catalog"):
    last = runpy.run_path(str(HERE / f"{part}.py"), run_name=part)
print(json.dumps(results))
last["spark"].stop()
