"""Whether a process lives: the one process helper every room needs (writers' arenas, readers' spill files,
services' attached applications), so it sits below them all."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone; another user's process as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True
