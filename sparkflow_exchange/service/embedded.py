"""The embedded default: one service with the coordinator role per user and host, started on first use.

Its address and a fresh secret sit in the runtime directory (0700, state file
0600), so every Spark application of the user on this host finds it and two
applications can meet at an exchange name. Applications (driver JVMs) attach
to it; it exits, removing its files, once the last one has ended and
``embedded.idleTimeout`` has passed.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..config import ENV_CONF, ExchangeConfig
from ..network.blocking_client import BlockingConnection, ServiceError
from .discovery import read_state, runtime_dir

_children: list[subprocess.Popen] = []  # keep a reference so the child is not reaped as garbage
_attached: set[int] = set()  # embedded service pids this process has attached its JVM to


def ensure_embedded(config: ExchangeConfig, timeout: float = 30.0) -> dict:
    directory = runtime_dir()
    state = directory / "embedded.json"
    with open(directory / "embedded.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = read_state(state)
        if info is None or not _answers(info):
            info = _start(config, directory, state, timeout)
    if info["pid"] not in _attached:
        _attached.add(info["pid"])
        attach_application(info["unix"], info.get("secret"))
    return info


def _answers(info: dict) -> bool:
    try:
        with BlockingConnection(info["unix"], info.get("secret"), timeout=5.0) as conn:
            conn.call("ping")
        return True
    except (ServiceError, OSError, KeyError):
        return False


def _start(config: ExchangeConfig, directory: Path, state: Path, timeout: float) -> dict:
    try:
        state.unlink()
    except FileNotFoundError:
        pass
    settings = config.to_keys()
    for per_use in ("exchange", "partitioner", "keys", "numSubpartitions", "partitionType", "custom", "numProducers"):
        settings.pop(per_use, None)
    env = {**os.environ, ENV_CONF: json.dumps(settings)}
    log = open(directory / "embedded.log", "ab")
    child = subprocess.Popen(
        [sys.executable, "-m", "sparkflow_exchange.service", "--embedded", "--state-file", str(state),
         "--unix", str(directory / "embedded.sock")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True, close_fds=True,
    )
    _children.append(child)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_state(state)
        if info is not None and info.get("pid") == child.pid:
            return info
        if child.poll() is not None:
            break
        time.sleep(0.05)
    tail = (directory / "embedded.log").read_text(errors="replace")[-2000:]
    raise ServiceError(f"the embedded exchange service did not start (see {directory / 'embedded.log'}):\n{tail}", "no_service")


def attach_application(endpoints_address: str, secret: str | None) -> None:
    """Tell the embedded service that the JVM above this Python worker uses it."""
    pid = driver_jvm_pid()
    if pid is None:
        return
    try:
        with BlockingConnection(endpoints_address, secret, timeout=5.0) as conn:
            conn.call("attach_app", app=f"jvm-{pid}", pid=pid)
    except ServiceError:
        pass


def driver_jvm_pid() -> int | None:
    """The nearest ``java`` ancestor of this process (the Spark JVM that started the Python worker)."""
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
