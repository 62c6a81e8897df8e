"""The checks of a test's child Spark application: each runs at once, a failure is recorded with its message and
trace, and the others still run; the application prints ``results`` as JSON for its test to assert on.
``APP_CHECKS_ONLY`` (comma-separated check names), when set, runs only those: for timing or debugging one check."""
from __future__ import annotations

import os
import time
import traceback

results: dict[str, dict] = {}


def check(fn):
    """Run one check now; a failure is recorded with its message, and the other checks still run."""
    only = os.environ.get("APP_CHECKS_ONLY")
    if only and fn.__name__ not in only.split(","):
        return fn
    details: dict = {}
    started = time.monotonic()
    try:
        fn(details)
        results[fn.__name__] = {"ok": True, **details}
    except Exception as exc:  # noqa: BLE001 - the test asserts on the message
        results[fn.__name__] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:6000],
                                "trace": traceback.format_exc()[-3000:], **details}
    results[fn.__name__]["seconds"] = round(time.monotonic() - started, 2)
    return fn
