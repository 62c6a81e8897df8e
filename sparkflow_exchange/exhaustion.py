"""Running out of file descriptors, disk or memory while serving one request: one clear sentence for its error.

A service that hits such a limit fails the request that hit it and goes on serving the rest; the
error names the limit and what to change, so the user is not left with a bare ``[Errno 24]``.
"""
from __future__ import annotations

import errno
import resource

_FDS = (errno.EMFILE, errno.ENFILE)
_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_MEMORY = (errno.ENOMEM, errno.ENOBUFS)


def nofile_limit() -> int:
    """This process's open-file limit (the soft RLIMIT_NOFILE, what ``ulimit -n`` shows)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def is_exhaustion(exc: BaseException) -> bool:
    """Whether ``exc`` says a resource ran out (not that the request was wrong)."""
    return isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno in _FDS + _DISK + _MEMORY)


def explain(exc: BaseException, what: str) -> str:
    """``what`` failed because of ``exc``: a sentence naming the limit reached when it is one, else the error."""
    code = getattr(exc, "errno", None)
    detail = f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    if code == errno.EMFILE:
        return (f"{what}: the service is out of file descriptors ({detail}; open-file limit {nofile_limit()}); "
                "try again later, or raise its limit (ulimit -n) or lower maxConnections / maxOpenSpillFiles")
    if code == errno.ENFILE:
        return f"{what}: the host is out of file descriptors ({detail}: the system-wide file table is full)"
    if code in _DISK:
        return f"{what}: no room left for spill files{where} ({detail}); free disk space or set spillDir elsewhere"
    if isinstance(exc, MemoryError) or code in _MEMORY:
        return f"{what}: the service is out of memory ({detail}); lower memory.budget or free memory on its host"
    return f"{what}: {type(exc).__name__}: {exc}"
