"""Start a service process in the background, or join the one already running, and attach a JVM to it.

Shared by the embedded default and the Spark plugin. A state file (0600) in
the per-user runtime directory names a running service; a lock beside it
makes concurrent starters agree on one. An attached service (``--embedded``)
exits by itself once every JVM attached to it has ended.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..config import ENV_CONF, ExchangeConfig
from ..errors import ErrorCode, ServiceError, ServiceUnavailable
from ..network.blocking_client import BlockingConnection
from ..pids import pid_alive  # noqa: F401 - services and the CLI ask it here
from .private_files import open_private, read_private, write_private
from .spill_root import SPILL_PREFIX, sweep  # noqa: F401 - a service's spill directory: <root>/<prefix><pid>-<random>

_children: list[subprocess.Popen] = []  # keep a reference so the child is not reaped as garbage
_attached: set[tuple[int, int]] = set()  # (service pid, jvm pid) pairs attached by this process
_answered: dict[str, dict] = {}  # state file -> the service it named when it last answered us
PER_USE_KEYS = ("exchange", "partitioner", "keys", "numSubpartitions", "partitionType", "custom", "numProducers")


def read_state(path: Path) -> dict | None:
    """A running service's state file; only a regular file of ours with mode 0600 is believed."""
    text = read_private(path)
    if text is None:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not isinstance(info, dict):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return None
    return info


def write_state(path: str | Path, info: dict) -> None:
    write_private(path, json.dumps(info))


def _answers(info: dict) -> bool:
    try:
        with BlockingConnection(info["unix"], info.get("secret"), timeout=5.0) as conn:
            conn.call("ping")
        return True
    except (ServiceError, OSError, KeyError):
        return False


def ensure_service(state: Path, config: ExchangeConfig, extra_args: list[str], *, attach_pid: int | None,
                   timeout: float = 30.0) -> dict:
    """The running service named by ``state``, started if needed, with ``attach_pid`` attached.

    A service this process has already seen answer, with ``attach_pid`` attached, is trusted while its
    state file still names it and its pid lives: every Spark write task asks, and a lock, a connection
    and a ping each time cost it several milliseconds. Otherwise the join happens under the launcher's
    lock, which a retiring service takes too: it never leaves a client that has just joined it.
    """
    known = _answered.get(str(state))
    if known is not None and (attach_pid is None or (known["pid"], attach_pid) in _attached):
        info = read_state(state)
        if info is not None and info == known:
            return info
    with launcher_lock(state):
        info = read_state(state)
        if info is None or not _answers(info):
            info = _start(state, config, extra_args, timeout)
        _answered[str(state)] = info
        return _attach_once(info, attach_pid)


def _attach_once(info: dict, attach_pid: int | None) -> dict:
    if attach_pid is not None and (info["pid"], attach_pid) not in _attached:
        attach(info, attach_pid)
        _attached.add((info["pid"], attach_pid))
    return info


@contextmanager
def launcher_lock(state: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold the lock beside ``state`` (yields False when ``wait`` is off and another process holds it).

    A retiring service removes the lock file while holding it; whoever was waiting on the removed
    file takes the lock again on a fresh one."""
    path = state.with_suffix(".lock")
    while True:
        fd = open_private(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        try:
            current = os.stat(path)
            mine = os.fstat(fd)
            if (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield True
    finally:
        os.close(fd)


class Retirement:
    """How a service with a state file leaves: under the launcher's lock, taking its files with it.

    ``begin`` (the service is idle and would exit) takes the lock without waiting (a client holds it
    while it joins: try again later) and removes the state file, so no client joins from then on;
    ``finish`` (after shutdown: the socket is gone) removes the lock file and an empty log, then lets
    go of the lock, so a successor never shares the socket path with a service on its way out.
    """

    def __init__(self, state: Path) -> None:
        self.state = Path(state)
        self._lock: Any = None

    def begin(self) -> bool:
        lock = launcher_lock(self.state, wait=False)
        if not lock.__enter__():
            return False
        self._lock = lock
        self._forget_state()
        return True

    def finish(self) -> None:
        if self._lock is None:  # stopped by a signal: wait a little for the lock, clean up anyway
            deadline = time.monotonic() + 2.0
            while not self.begin() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._forget_state()
        if self._lock is None:
            return
        log_path = self.state.with_suffix(".log")
        try:
            if log_path.stat().st_size == 0:
                log_path.unlink()
        except OSError:
            pass
        try:
            self.state.with_suffix(".lock").unlink()
        except OSError:
            pass
        self._lock.__exit__(None, None, None)
        self._lock = None

    def _forget_state(self) -> None:
        try:
            if json.loads(read_private(self.state) or "{}").get("pid") == os.getpid():
                self.state.unlink()
        except (OSError, ValueError):
            pass


def sweep_orphan_spill_dirs() -> list[str]:
    """Remove default spill directories (and shared-memory arenas) of this user's dead services (kill -9)."""
    import tempfile

    from ..partition.shared_arena import sweep_orphan_arenas

    return sweep(Path(tempfile.gettempdir())).removed + [str(p) for p in sweep_orphan_arenas()]


def _start(state: Path, config: ExchangeConfig, extra_args: list[str], timeout: float) -> dict:
    sweep_orphan_spill_dirs()
    try:
        state.unlink()
    except FileNotFoundError:
        pass
    settings = {k: v for k, v in config.to_keys().items() if k not in PER_USE_KEYS}
    env = {**os.environ, ENV_CONF: json.dumps(settings)}
    log_path = state.with_suffix(".log")
    with os.fdopen(open_private(log_path, os.O_WRONLY | os.O_APPEND), "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "sparkflow_exchange.service", "--embedded", "--state-file", str(state), *extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True,
            close_fds=True,
        )
    _children.append(child)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_state(state)
        if info is not None and info.get("pid") == child.pid:
            return info
        if child.poll() is not None:
            break
        time.sleep(0.01)  # the service is up in about a quarter of a second: a first write waits for it
    tail = log_path.read_text(errors="replace")[-2000:]
    raise ServiceUnavailable(f"the exchange service did not start (log {log_path}):\n{tail}", ErrorCode.NO_SERVICE)


def attach(info: dict, pid: int) -> None:
    """Tell a service that the JVM ``pid`` uses it; it stays up while any attached JVM lives."""
    try:
        with BlockingConnection(info["unix"], info.get("secret"), timeout=5.0) as conn:
            conn.call("attach_app", app=f"jvm-{pid}", pid=pid)
    except ServiceError:
        pass


_jvm_of: dict[int, int | None] = {}  # this process's pid -> its JVM (a forked child looks again)


def jvm_pid() -> int | None:
    """The nearest ``java`` ancestor of this process: the Spark JVM that started this Python worker.

    Looked up once per process (every write task asks twice; walking /proc cost 0.4 ms each time): a
    Spark worker's JVM is its parent's and does not change while the worker lives."""
    me = os.getpid()
    if me not in _jvm_of:
        _jvm_of.clear()
        _jvm_of[me] = _find_jvm_pid()
    return _jvm_of[me]


def _find_jvm_pid() -> int | None:
    pid = os.getpid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return None
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if comm == "java" and pid != os.getpid():
            return pid
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if pid <= 1:
            return None
    return None
