"""A service's log stays small whatever happens to it, one record per line.

A service refusing connections at its fd limit, or failing the same read over and over, would
otherwise log a line (or a traceback) per event: megabytes a second. So each kind of message is
rate-limited. A message kind is its logger and
format string; each may log :data:`BURST` records per :data:`WINDOW` seconds, and when its next record
comes after the window, one line first says how many were left out. Tracebacks are kept for the first
record of a kind only. Control characters in a message (a newline in an exchange name a client
chose) are escaped, so no one can add lines of their own to the log.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

BURST = 5
WINDOW = 10.0


class RateLimit(logging.Filter):
    def __init__(self, burst: int = BURST, window: float = WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self.clock = clock
        self._kinds: dict[tuple[str, object], list] = {}  # kind -> [window start, logged, dropped, seen before]

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        kind = (record.name, record.msg)
        state = self._kinds.get(kind)
        if state is None:
            if len(self._kinds) > 10_000:  # kinds come from format strings: a few hundred at most
                self._kinds.clear()
            state = self._kinds[kind] = [now, 0, 0, False]
        if now - state[0] >= self.window:
            if state[2]:
                record.msg = f"({state[2]} more like the next one left out in {now - state[0]:.0f} s) {record.msg}"
            state[0], state[1], state[2] = now, 0, 0
        if state[1] >= self.burst:
            state[2] += 1
            return False
        state[1] += 1
        if state[3]:
            record.exc_info = None  # the first of a kind showed where it comes from
            record.exc_text = None
            record.stack_info = None
        state[3] = True
        message = record.getMessage()
        if not message.isprintable():
            record.msg, record.args = printable(message), None
        return True


def printable(text: str) -> str:
    """``text`` with control characters (newlines...) escaped as Python would write them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def install(handler: logging.Handler) -> None:
    """Rate-limit what ``handler`` writes (the service's stderr log)."""
    handler.addFilter(RateLimit())
