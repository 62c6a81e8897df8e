"""A worker host without its exchange service says so loudly: the plugin's executor launcher fails with one line
naming the host and the exact command that starts the service, and that command, run as given, is what the
launcher then attaches to."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
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


@pytest.mark.spark
@pytest.mark.cluster
def test_the_driver_log_and_the_first_use_name_the_host_without_a_service_and_the_command(tmp_path, jar):
    coordinator = start_service(tmp_path / "coordinator")
    secret = coordinator.home / "secret"
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.jars {jar}\n"
        "spark.plugins org.sparkflow.exchange.ExchangePlugin\n"
        f"spark.pyspark.python {sys.executable}\n"
        "spark.ui.enabled false\n"
        f"spark.sparkflow.exchange.coordinator {coordinator.tcp}\n"
        f"spark.sparkflow.exchange.secretFile {secret}\n")
    go = tmp_path / "go"
    env = {**os.environ, "SPARK_CONF_DIR": str(conf), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    app = subprocess.Popen([sys.executable, str(Path(__file__).parent / "app_missing_service.py"), str(go)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in app.stderr:
            lines.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    command = (f"sparkflow-exchange serve --no-coordinator --coordinator {coordinator.tcp} --secret-file {secret} "
               "--host 127.0.0.1")
    try:
        deadline = time.monotonic() + 400
        said = []
        while not said and time.monotonic() < deadline and app.poll() is None:
            time.sleep(0.5)
            said = [line for line in list(lines) if line.startswith("ERROR sparkflow-exchange: an executor on host")]
        assert said, "".join(line for line in lines if "sparkflow" in line)[-5000:]
        host = socket.gethostname()
        assert "could not start" in said[0] and f"host {host} has no exchange service" in said[0], said[0]
        assert f"`{command}`" in said[0], said[0]
        first = next(i for i, line in enumerate(list(lines)) if line.startswith("ERROR sparkflow-exchange: an executor"))
        lost = re.compile(r"Lost (an )?executor \d+ ")

        def lost_again() -> bool:  # Spark started an executor there again, and lost it again (its log says so)
            return any(lost.search(line) for line in list(lines)[first + 1:])

        while not lost_again() and time.monotonic() < deadline and app.poll() is None:
            time.sleep(0.2)
        assert lost_again(), "".join(lines)[-5000:]
        # the driver said it once
        assert len([line for line in list(lines) if line.startswith("ERROR sparkflow-exchange:")]) == 1
        go.touch()
        assert app.stdout.readline().strip() == "planned"
        app.wait(60)
        reader.join(30)
        first_use = "".join(lines).split("WARN sparkflow-exchange: executors of 1 host(s) did not start", 1)
        assert len(first_use) == 2, "".join(lines)[-5000:]
        assert f"host {host} has no exchange service" in first_use[1] and command in first_use[1]
    finally:
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)  # the application's session: its JVM and the executors it started
            app.wait(30)
        coordinator.stop()
