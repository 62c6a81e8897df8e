"""Start a service process and drive it by pid: for tests, benchmarks and notebooks.

``start_service`` runs ``python -m sparkflow_exchange.service`` with its own spill
directory, secret file and Unix socket under a directory you give, waits for
the address line and returns a handle that stops exactly that process.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.network.blocking_client import BlockingConnection
from sparkflow_exchange.pids import pid_alive
from sparkflow_exchange.service.private_files import write_private


@dataclass
class RunningService:
    proc: subprocess.Popen
    info: dict
    secret: str
    spill_dir: Path  # the service's own spill directory (inside the spill root it was given)
    home: Path  # the directory given to start_service: its secret file, socket and log

    @property
    def tcp(self) -> str:
        return self.info["tcp"]

    @property
    def unix(self) -> str:
        return self.info["unix"]

    def connect(self, address: str | None = None, secret: str | None = "__default__", host_id: str = "") -> BlockingConnection:
        return BlockingConnection(address or self.tcp, self.secret if secret == "__default__" else secret,
                                  timeout=10.0, host_id=host_id)

    def status(self) -> dict:
        with self.connect() as conn:
            return conn.call("status")

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(5)


def start_service(tmp: Path, *, host: str = "127.0.0.1", host_id: str | None = None, coordinator: bool = True,
                  secret: str = "test-secret", conf: dict | None = None, extra: list[str] | None = None,
                  nofile: int | None = None, fsize: int | None = None, port: int = 0,
                  env: dict[str, str] | None = None, spill: Path | None = None) -> RunningService:
    """``port``: a fixed TCP port (a restart at the address clients know); ``env``: variables to set for it
    (e.g. its runtime directory). ``nofile``: the service process's open-file limit (RLIMIT_NOFILE, soft and hard), as ``ulimit -n`` sets
    it; ``fsize``: the largest file it may write (RLIMIT_FSIZE: a write beyond fails as a full disk would);
    ``spill``: its spill root (spillDir, default ``tmp/spill``), which several services may share."""
    tmp.mkdir(parents=True, exist_ok=True)
    secret_file = tmp / "secret"
    write_private(secret_file, secret)  # mode 0600: a secret file others may read is refused
    spill = Path(spill) if spill is not None else tmp / "spill"
    args = [sys.executable, "-m", "sparkflow_exchange.service", "--host", host, "--port", str(port),
            "--secret-file", str(secret_file), "--spill-dir", str(spill), "--unix", str(tmp / "svc.sock"),
            "--host-id", host_id or host]
    if not coordinator:
        args.append("--no-coordinator")
    for key, value in (conf or {}).items():
        args += ["--conf", f"{key}={value}"]
    args += extra or []
    limits = [(kind, value) for kind, value in ((resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_FSIZE, fsize))
              if value is not None]

    def limit() -> None:
        for kind, value in limits:
            resource.setrlimit(kind, (value, value))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(tmp / "service.log", "ab"), text=True,
                            preexec_fn=limit if limits else None, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 20
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip():
            break
        if proc.poll() is not None:
            break
    if not line.strip():
        proc.kill()
        raise RuntimeError(f"service did not start: {(tmp / 'service.log').read_text()[-2000:]}")
    info = json.loads(line)
    return RunningService(proc, info, secret, Path(info.get("spill_dir") or spill), tmp)


def stop_embedded(runtime: Path, timeout: float = 30.0) -> int | None:
    """Stop the embedded service of the runtime directory ``runtime`` (SIGTERM, by the pid in its state
    file) and wait for it to exit; returns its pid, or None when none runs.

    An embedded service keeps the exchanges it holds for later applications (until dropped or ``ttl``):
    a test or benchmark run with a runtime directory of its own ends the one its applications left."""
    from .launcher import read_state

    info = read_state(Path(runtime) / "embedded.json")
    if info is None:
        return None
    pid = info["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:  # started detached by a launcher of this process: reap it if it is our child
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            pass
        if not pid_alive(pid):  # exited, or a zombie its parent (not this process) has yet to reap
            break
        time.sleep(0.05)
    return pid


def client_config(coordinator: RunningService, **options) -> ExchangeConfig:
    """A config pointing at a test service (as options would); ``service=`` may name another one."""
    opts = {"coordinator": coordinator.tcp, "service": coordinator.tcp, "secret": coordinator.secret}
    opts.update(options)
    return ExchangeConfig.load(opts, spark_conf={})
