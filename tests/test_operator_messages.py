"""An operator is never left guessing: `serve` says which configuration it read and warns when a cluster
node got settings only a single host can use; the CLI says where it looked, and waits for a restarting
coordinator as long as coordinator.retryTimeout says."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import start_service

from sparkflow_exchange.config import ENV_CONF
from sparkflow_exchange.service.private_files import write_private


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no Spark conf, no settings variable, a runtime directory of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME", ENV_CONF)}
    env["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env.update(extra)
    return env


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """Start `serve`, read its address line, stop it; its address info and what it wrote on stderr."""
    err = tmp_path / "serve.err"
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "sparkflow_exchange.cli", "serve", "--port", "0",
                                 "--spill-dir", str(tmp_path / "spill"), *args], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env=env or _env(tmp_path))
        try:
            line = proc.stdout.readline()
        finally:
            proc.terminate()
            proc.wait(30)
    text = err.read_text()
    assert line.strip(), text
    return json.loads(line), text


def test_serve_says_which_configuration_it_read(tmp_path):
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.sparkflow.exchange.ttl 2h\nspark.master local\n")
    write_private(tmp_path / "secret", "s3cret")
    _info, err = _serve(tmp_path, "--secret-file", str(tmp_path / "secret"), "--conf", "maxDiskBytes=1g",
                        env=_env(tmp_path, SPARK_CONF_DIR=str(conf_dir), **{ENV_CONF: '{"heartbeatInterval": "2s"}'}))
    [line] = [x for x in err.splitlines() if x.startswith("sparkflow-exchange serve: settings from")]
    assert f"spark-defaults.conf {conf_dir / 'spark-defaults.conf'} (1 spark.sparkflow.exchange.* settings)" in line
    assert f"{ENV_CONF} set" in line and "--secret-file" in line and "--conf maxDiskBytes" in line
    assert f"secretFile {tmp_path / 'secret'}" in line and "the coordinator" in line
    assert "WARNING" not in err  # loopback, a secret of its own: a single host, as meant

    _info, err = _serve(tmp_path)  # nothing configured: it says so, and where it looked
    assert "no spark-defaults.conf (SPARK_CONF_DIR and SPARK_HOME are unset)" in err and f"{ENV_CONF} unset" in err
    assert "a fresh random secret" in err and "WARNING" not in err


def test_a_cluster_node_with_loopback_or_a_fresh_secret_is_warned(tmp_path):
    # every interface, no secret file: the fresh secret is one no other host knows
    _info, err = _serve(tmp_path, "--host", "0.0.0.0")
    assert "WARNING" in err and "fresh random secret no other host knows although it listens on 0.0.0.0" in err
    assert "--secret-file" in err

    # advertised to others but listening on loopback: nobody else reaches it
    write_private(tmp_path / "secret", "s3cret")
    _info, err = _serve(tmp_path, "--advertised-host", "10.20.30.40", "--secret-file", str(tmp_path / "secret"))
    assert "listening on loopback (127.0.0.1) only although it advertises 10.20.30.40" in err
    assert "fresh random secret" not in err

    # a worker host's command whose spark-defaults.conf was not read: it reports to no coordinator
    _info, err = _serve(tmp_path, "--no-coordinator", "--secret-file", str(tmp_path / "secret"))
    assert "--no-coordinator without a coordinator: this service reports to none" in err
    assert "no spark-defaults.conf (SPARK_CONF_DIR and SPARK_HOME are unset)" in err


def test_cli_without_configuration_says_where_it_looked(tmp_path):
    env = _env(tmp_path)
    out = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "list"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0 and "no exchange service is running" in out.stderr
    assert str(tmp_path / "runtime") in out.stderr and "SPARKFLOW_EXCHANGE_RUNTIME_DIR" in out.stderr
    assert "no spark-defaults.conf (SPARK_CONF_DIR and SPARK_HOME are unset)" in out.stderr
    out = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "status"], capture_output=True,
                         text=True, timeout=60, env={**env, "SPARK_HOME": str(tmp_path / "spark")})
    assert out.returncode == 1
    assert f"no spark-defaults.conf (none at {tmp_path / 'spark' / 'conf' / 'spark-defaults.conf'})" in out.stderr


def test_cli_waits_for_a_restarting_coordinator_as_long_as_retry_timeout_says(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_private(tmp_path / "secret", "test-secret")
    settings = {"coordinator": f"127.0.0.1:{port}", "secretFile": str(tmp_path / "secret"),
                "coordinator.retryTimeout": "40s"}
    env = _env(tmp_path, **{ENV_CONF: json.dumps(settings)})
    began = time.monotonic()
    cli = subprocess.Popen([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    svc = None
    try:
        time.sleep(12)  # longer than the CLI waited before: it now waits the 40 s the setting gives
        assert cli.poll() is None, cli.communicate()[1]
        svc = start_service(tmp_path / "coordinator", port=port, env={"SPARKFLOW_EXCHANGE_RUNTIME_DIR":
                                                                      str(tmp_path / "svc-runtime")})
        out, err = cli.communicate(timeout=60)
        assert cli.returncode == 0, err
        assert [s["service"]["tcp"] for s in json.loads(out)] == [svc.tcp]
        assert time.monotonic() - began < 40
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        if svc is not None:
            svc.stop()
