"""What a coordinator with a state file remembers on disk: the names of the exchanges it holds.

A service that is killed (or crashes) takes its exchanges' data with it, and the next embedded
service started for the user knows nothing of them: a read would wait ``declareTimeout`` and then
say the exchange "does not exist". So the coordinator keeps the names of its exchanges in a small
file beside its state file (``embedded.exchanges.json``, 0600), rewritten when an exchange is
declared or dropped. A successor that finds the file naming a dead pid marks those names *lost*
and a read of one fails at once saying why. A service stopped on purpose while it still holds
exchanges marks them lost the same way. A lost mark ends when the name is written again or dropped,
or after ``ttl``; a clean exit removes the file unless it still carries lost marks.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .launcher import pid_alive, write_state
from .private_files import read_private

Lost = dict[str, dict]  # name -> {"message": why its data is gone, "at": epoch seconds}


class ExchangeLedger:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._last: tuple | None = None

    def take_over(self) -> Lost:
        """The lost exchanges of a predecessor that ended without a clean exit, and those it carried."""
        try:
            data = json.loads(read_private(self.path) or "{}")
        except ValueError:
            return {}
        pid = data.get("pid")
        if not isinstance(pid, int) or (pid != os.getpid() and pid_alive(pid)):
            return {}  # not ours to take: a live service still owns it
        lost: Lost = {n: v for n, v in data.get("lost", {}).items() if isinstance(v, dict) and "message" in v}
        now = time.time()
        seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data.get("updated", now)))
        for name in data.get("exchanges", []):
            lost[name] = {"at": now, "message": (
                f"exchange {name!r} was lost: the exchange service that held it (pid {pid}) ended without "
                f"shutting down (killed or crashed; its last change was at {seen}), and the exchange's data "
                "went with it. Write the exchange again")}
        return lost

    def record(self, names: list[str], lost: Lost) -> None:
        """Write the current names (only when they or the lost marks changed)."""
        state = (tuple(names), tuple(sorted(lost)))
        if state == self._last:
            return
        self._last = state
        write_state(self.path, {"pid": os.getpid(), "updated": time.time(), "exchanges": names, "lost": lost})

    def close(self, lost: Lost, held: list[str] = ()) -> None:
        """A clean exit. ``held``: exchanges it still held (stopped on purpose, not idle): marked lost, as
        are the lost marks it carried; with neither, the file goes."""
        if held:
            when = time.strftime("%Y-%m-%d %H:%M:%S")
            lost = {**lost, **{name: {"at": time.time(), "message": (
                f"exchange {name!r} was lost: the exchange service that held it (pid {os.getpid()}) was stopped "
                f"at {when} while holding it (SIGTERM or a shutdown request), and the exchange's data went "
                "with it. Write the exchange again")} for name in held}}
        if lost:
            self.record([], lost)
            return
        try:
            if json.loads(read_private(self.path) or "{}").get("pid") == os.getpid():
                self.path.unlink()
        except (OSError, ValueError):
            pass
