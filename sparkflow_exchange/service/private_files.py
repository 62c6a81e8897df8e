"""Files only this user may touch: the runtime directory and its state, lock and log files.

The runtime directory (``/tmp/sparkflow-exchange-<uid>`` by default) sits in a
world-writable place and its state files carry secrets and addresses, so
nothing in it is taken on trust: the directory must be a real directory of
this user with mode 0700 (else a clear error); files are created with
``O_EXCL``/``O_NOFOLLOW`` (never through a planted link); a state file is
read only when it is a regular file of this user with mode 0600.
"""
from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from pathlib import Path

from ..errors import UserFacing

log = logging.getLogger(__name__)

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class UnsafePathError(UserFacing, RuntimeError):
    """A runtime path is not private to this user; using it could leak the secret or let another user in."""


def ensure_private_dir(path: str | Path) -> Path:
    """Create ``path`` with mode 0700 if needed; refuse it unless it is a real directory of ours with mode 0700."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    fix = "remove it or point SPARKFLOW_EXCHANGE_RUNTIME_DIR at a directory of yours with mode 0700"
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"the runtime directory {path} is a symbolic link; it must be a real directory ({fix})")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"the runtime directory {path} is not a directory ({fix})")
    if st.st_uid != os.getuid():
        raise UnsafePathError(f"the runtime directory {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): "
                              f"another user could read its secrets or plant files there ({fix})")
    if st.st_mode & 0o077:
        raise UnsafePathError(f"the runtime directory {path} has mode {stat.S_IMODE(st.st_mode):o}; it must be 700 "
                              f"(chmod 700 {path}, or {fix})")
    return path


def write_private(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) atomically, through a fresh file no link can redirect."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # replaces a link itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_private(path: str | Path) -> str | None:
    """The file's text if it is a regular file of ours with mode 0600; None if absent or not to be trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symbolic link
        log.warning("ignoring %s: %s", path, exc)
        return None
    with os.fdopen(fd, "r") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600:
            log.warning("ignoring %s: not a regular file of uid %d with mode 600", path, os.getuid())
            return None
        try:
            return f.read()
        except (OSError, UnicodeDecodeError):
            return None


def open_private(path: str | Path, flags: int) -> int:
    """An fd on ``path`` (created 0600), refusing links and files of other users (lock and log files)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | _NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symbolic link; it must be a regular file of yours (remove it)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise UnsafePathError(f"{path} is not a regular file of yours; remove it")
    return fd


def runtime_dir() -> Path:
    """Per-user directory (0700) holding the state files of services started for this user."""
    base = os.environ.get("SPARKFLOW_EXCHANGE_RUNTIME_DIR") or f"/tmp/sparkflow-exchange-{os.getuid()}"
    return ensure_private_dir(base)
