"""The embedded default: one service with the coordinator role per user and host, started on first use.

Its address and a fresh secret sit in the runtime directory (0700, state file
0600), so every Spark application of the user on this host finds it and two
applications can meet at an exchange name. The JVM above the Python worker
that uses it attaches to it (a Python process with no JVM above it, a script
using the client API or the driver itself, attaches itself). Exchanges
outlive the applications that wrote them: the service stays up while it
holds any (until dropped, or expired after ``ttl``), and exits, removing its
files, once the last attached process has ended, it holds nothing, and
``embedded.idleTimeout`` has passed. Its spill files are bounded by
``maxDiskBytes``.
"""
from __future__ import annotations

import os

from ..config import ExchangeConfig
from .launcher import ensure_service, jvm_pid
from .private_files import runtime_dir


def ensure_embedded(config: ExchangeConfig, timeout: float = 30.0, attach_pid: int | None = None) -> dict:
    """The embedded service's state, started if needed, with ``attach_pid`` (default: the JVM above this process,
    else this process) attached."""
    directory = runtime_dir()
    return ensure_service(directory / "embedded.json", config,
                          ["--unix", str(directory / "embedded.sock"), "--hold-exchanges"],
                          attach_pid=attach_pid or jvm_pid() or os.getpid(), timeout=timeout)
