"""A service's own spill directory under a shared spill root, and what dead services left there.

Every service writes its spill files (and its default Unix socket, a generated secret) into a directory
of its own, ``<root>/sfx-<pid>-<random>`` (short: a Unix socket path has at most 107 bytes), where
``<root>`` is ``spillDir`` (or the temp directory). It holds an exclusive ``flock`` on the ``.lock``
file inside for as long as it lives: the kernel lets go of it when the process ends, however it ends
(kill -9 included). A service starting on the same root removes the directories whose lock nobody
holds; a live service's directory is never touched, whichever pid namespace it runs in. A directory
without a held lock may be one being made at that moment (between ``mkdir`` and the lock): it is only
taken for dead when its pid is gone too, or when it is older than ``BIRTH_GRACE``; one without a lock
file at all only when it is empty too (the prefix is short: someone else's directory is never emptied).
Directories of earlier versions (``sparkflow-spill-<pid>-<random>``, no lock) are removed when their
pid is gone. What it cannot remove (an immutable file, a read-only file system) the service counts
against its own ``maxDiskBytes`` and reports in ``status``.
"""
from __future__ import annotations

import fcntl
import logging
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..pids import pid_alive

log = logging.getLogger(__name__)

SPILL_PREFIX = "sfx-"  # <root>/<prefix><pid>-<random>: one service's spill directory
LEGACY_PREFIX = "sparkflow-spill-"  # earlier versions' default spill directories (no lock)
LOCK_NAME = ".lock"  # held (flock, exclusive) by the service for its whole life
BIRTH_GRACE = 60.0  # s: an unlocked directory younger than this whose pid lives may be one being made


class SpillHome:
    """This service's spill directory, locked while the service lives; ``remove`` takes it away."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        while True:
            path = self.root / f"{SPILL_PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
            try:
                os.mkdir(path, 0o700)
                break
            except FileExistsError:
                continue
        self.path = path
        try:
            self._fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                               | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def remove(self) -> None:
        """Everything in it goes, the lock last (a directory of ours without its lock is empty)."""
        try:
            entries = list(os.scandir(self.path))
        except OSError:
            entries = []
        for entry in entries:
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class Sweep:
    """What a sweep of a spill root did: directories removed, and dead ones left (path -> bytes still there)."""
    removed: list[str] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)


def _lock_free(directory: Path) -> bool:
    """Whether nobody holds the directory's lock (True too when it has none). Takes it while it looks;
    whoever holds it, even in another pid namespace, makes it False."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:  # e.g. not ours to open: cannot tell, so alive
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _dead(directory: Path, st: os.stat_result) -> bool:
    legacy = directory.name.startswith(LEGACY_PREFIX)
    try:
        pid = int(directory.name[len(LEGACY_PREFIX if legacy else SPILL_PREFIX):].split("-", 1)[0])
    except ValueError:
        return False
    if legacy:
        return not pid_alive(pid)
    if not (directory / LOCK_NAME).exists() and any(directory.iterdir()):
        return False  # not one of ours (ours lock before they hold anything)
    if not _lock_free(directory):
        return False
    # unlocked: dead, unless it is being made right now (its pid lives and it is young)
    return not pid_alive(pid) or time.time() - st.st_mtime > BIRTH_GRACE


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed; what it may not read, not counted)."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                total += tree_bytes(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def service_dirs(root: Path) -> list[Path]:
    """The services' spill directories under ``root`` (links and files under the prefix are no directory)."""
    found = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found
    for entry in entries:
        if entry.name.startswith((SPILL_PREFIX, LEGACY_PREFIX)) and entry.is_dir(follow_symlinks=False):
            found.append(Path(entry.path))
    return found


def sweep(root: Path, keep: Path | None = None) -> Sweep:
    """Remove this user's spill directories under ``root`` whose service is dead; ``keep`` is never touched."""
    result = Sweep()
    for directory in service_dirs(Path(root)):
        if keep is not None and directory == keep:
            continue
        try:
            st = directory.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or not _dead(directory, st):
                continue
        except OSError:
            continue
        shutil.rmtree(directory, ignore_errors=True)
        if directory.exists():
            result.left[str(directory)] = tree_bytes(directory)
        else:
            result.removed.append(str(directory))
    return result


def root_bytes(root: Path) -> int:
    """Bytes of every service's spill directory under ``root``: live ones and what dead ones left."""
    return sum(tree_bytes(d) for d in service_dirs(Path(root)))
