"""A worker host without its exchange service says so loudly: the plugin's executor launcher fails with one line
naming the host and the exact command that starts the service, and that command, run as given, is what the
launcher then attaches to."""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import start_service

BIN = Path(sys.executable).parent


def _launcher(tmp_path: Path, conf: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME")}
    env.update(SPARKFLOW_EXCHANGE_RUNTIME_DIR=str(tmp_path / "runtime"), SPARKFLOW_EXCHANGE_CONF=json.dumps(conf),
               PATH=f"{BIN}:{env.get('PATH', '')}")
    return subprocess.run([sys.executable, "-m", "sparkflow_exchange.service.plugin", "executor", "--jvm-pid",
                           str(os.getpid()), "--executor-id", "0"], capture_output=True, text=True, timeout=120,
                          env=env)


def test_a_host_without_its_service_names_itself_and_the_command_that_starts_it(tmp_path):
    coordinator = start_service(tmp_path / "coordinator")
    served = None
    try:
        secret = coordinator.home / "secret"
        conf = {"coordinator": coordinator.tcp, "secretFile": str(secret)}
        proc = _launcher(tmp_path, conf)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stderr  # one line, no traceback
        line = lines[0]
        assert f"host {socket.gethostname()} has no exchange service for the coordinator {coordinator.tcp}" in line
        command = line.split("`")[1]
        assert command == (f"sparkflow-exchange serve --no-coordinator --coordinator {coordinator.tcp} "
                           f"--secret-file {secret} --host 127.0.0.1")

        # the command, exactly as said (on this host, as the executor's user): the launcher then attaches to it
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME")}
        env.update(SPARKFLOW_EXCHANGE_RUNTIME_DIR=str(tmp_path / "runtime"), PATH=f"{BIN}:{env.get('PATH', '')}")
        served = subprocess.Popen(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  env=env, cwd=tmp_path)
        started, deadline = "", time.monotonic() + 60
        while not started.strip() and time.monotonic() < deadline and served.poll() is None:
            started = served.stdout.readline()
        assert started.strip(), "the command started no service"
        attached = _launcher(tmp_path, conf)
        assert attached.returncode == 0, attached.stderr
        answer = json.loads(attached.stdout.strip().splitlines()[-1])
        assert answer["pid"] == served.pid
    finally:
        if served is not None:
            served.send_signal(signal.SIGTERM)
            served.wait(30)
        coordinator.stop()
