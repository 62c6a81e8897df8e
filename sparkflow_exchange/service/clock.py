"""Wall-clock times for what the service measures on the monotonic clock (ages, TTLs).

One offset per process, taken at import: the same monotonic instant always reports the same wall time, so two
descriptions of an unchanged exchange agree to the microsecond (converting with a fresh ``time.time()`` each
call made them differ by the microseconds between the calls).
"""
from __future__ import annotations

import time

_WALL_MINUS_MONOTONIC = time.time() - time.monotonic()


def wall_time(monotonic_seconds: float) -> float:
    """Seconds since the epoch (UTC) of ``monotonic_seconds``, a value of ``time.monotonic()`` in this process."""
    return monotonic_seconds + _WALL_MINUS_MONOTONIC
