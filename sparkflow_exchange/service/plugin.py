"""The Python half of the Spark plugin (``jvm-stub/``): ``python -m sparkflow_exchange.service.plugin``.

The Java plugin only runs this launcher; everything else is here:

* ``driver --jvm-pid P --app-id A``: start the application's coordinator
  (attached to the driver JVM), print ``{"coordinator", "secret", "host_id", "metrics"}``.
* ``executor --jvm-pid P --executor-id E``: start or join this host's service
  (``serviceScope=host``) or start one for this executor (``executor``),
  attached to the executor JVM; write ``jvm-P.json`` so the executor's Python
  workers find it with no configuration.

With a coordinator of the operator's configured (``coordinator`` in spark-defaults.conf, a ``serve``
that is not attached to any application) neither starts a service: the driver checks that it answers
and hands no secret over (every host reads ``secretFile``); the executor attaches to the service
``serve --no-coordinator`` runs on its host for that coordinator (``service``, else its state file in
the runtime directory) and fails to start, saying what to run, when there is none.

Both answers carry ``metrics``: the URL of the service's Prometheus text (an ephemeral loopback port when
``metricsPort`` is not set; empty when a service started without one is joined), which the plugin's gauges
in Spark's metrics system read.
* ``embedded --jvm-pid P``: start or join this user's embedded service on this host, attached to the JVM,
  and print ``{"unix", "pid"}``: ``format("pipelined")`` served by the JVM in a local application that found
  no service (a Python writer would have started the same one).
* ``detach --jvm-pid P``: forget the JVM's file (the service also notices the
  JVM is gone and exits once nothing attached to it lives).

Settings arrive as JSON in ``SPARKFLOW_EXCHANGE_CONF`` (the plugin's copy of
every ``spark.sparkflow.exchange.*`` entry).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import socket
from pathlib import Path

from ..config import ExchangeConfig, read_spark_defaults
from ..errors import ExchangeError, UserFacing
from ..network import auth
from .discovery import Endpoints, ServiceKind, host_service_for, jvm_file, running_services, runtime_dir
from .launcher import ensure_service, sweep_orphan_spill_dirs, write_state

LAUNCHER_PATIENCE = 30.0  # s: the Java plugin waits 60 s for the launcher's answer


def _driver(args: argparse.Namespace) -> dict:
    config = ExchangeConfig.load()
    if config.coordinator:
        return _driver_of_cluster(config)
    secret = config.resolved_secret() or auth.new_secret()
    config = config.replace(secret=secret, idle_timeout=min(config.idle_timeout, 5.0))
    state = runtime_dir() / f"coordinator-{args.jvm_pid}.json"
    extra = ["--host", config.bind_host, "--metrics"]
    driver_host = spark_driver_host(args.jvm_pid)
    if driver_host:
        extra += ["--driver-host", driver_host]
    info = ensure_service(state, config, extra, attach_pid=args.jvm_pid)
    result = {"coordinator": info["tcp"], "secret": secret, "host_id": info["host_id"], "pid": info["pid"],
              "metrics": _metrics_url(config, info)}
    write_state(jvm_file(args.jvm_pid), {**info, "pid": args.jvm_pid, "service_pid": info["pid"],
                                          "coordinator_address": info["tcp"], "secret": secret})
    return result


def spark_driver_host(jvm_pid: int) -> str | None:
    """``spark.driver.host`` as the driver JVM was given it (``--conf`` on its command line, else
    spark-defaults.conf): Spark's own notion of the driver host's address; None when not set."""
    try:
        argv = Path(f"/proc/{jvm_pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.removeprefix("-D") == "spark.driver.host" and value.strip():
            return value.strip()
    return read_spark_defaults().get("spark.driver.host") or None


def _executor(args: argparse.Namespace) -> dict:
    config = ExchangeConfig.load()
    if not config.coordinator:
        raise SystemExit("executor launcher: no 'coordinator' setting was handed over by the driver plugin")
    if not _ask_coordinator(config).get("attached", True):
        return _attach_to_host_service(args, config)
    config = config.replace(idle_timeout=min(config.idle_timeout, 5.0))
    extra = ["--no-coordinator", "--metrics"]
    if config.service_scope == "executor":
        state = runtime_dir() / f"executor-{args.jvm_pid}.json"
        if not config.host_id:
            config = config.replace(host_id=f"{socket.gethostname()}/executor-{args.executor_id}")
    else:
        key = hashlib.sha256(f"{config.coordinator}".encode()).hexdigest()[:12]
        state = runtime_dir() / f"host-service-{key}.json"
    info = ensure_service(state, config, extra, attach_pid=args.jvm_pid)
    write_state(jvm_file(args.jvm_pid), {**info, "pid": args.jvm_pid, "service_pid": info["pid"],
                                          "coordinator_address": config.coordinator,
                                          "secret": config.resolved_secret()})
    return {"service": info["tcp"], "unix": info["unix"], "host_id": info["host_id"], "pid": info["pid"],
            "metrics": _metrics_url(config, info)}


def _ask_coordinator(config: ExchangeConfig) -> dict:
    """The configured coordinator's addresses (``attached``: it is an application's, started by its driver)."""
    ep = Endpoints(config.coordinator, config.coordinator, config.resolved_secret(), config.resolved_host_id(),
                   min(config.coordinator_retry_timeout, LAUNCHER_PATIENCE))
    try:
        with ep.connect(config.coordinator, config, timeout=15.0) as conn:
            return conn.call("ping")
    except ExchangeError as exc:
        raise SystemExit(f"sparkflow-exchange: the coordinator {config.coordinator} (spark.sparkflow.exchange."
                         f"coordinator) cannot be used: {exc}") from None


def _driver_of_cluster(config: ExchangeConfig) -> dict:
    """A coordinator of the operator's is configured (spark-defaults.conf): the application starts none, and
    its executors use their hosts' running services. The secret is not handed over: every host reads
    its ``secretFile``."""
    if not config.resolved_secret():
        raise SystemExit(f"sparkflow-exchange: the coordinator {config.coordinator} is configured without a secret: "
                         "set spark.sparkflow.exchange.secretFile (the file the services were started with)")
    info = _ask_coordinator(config)
    if not info.get("coordinator"):
        raise SystemExit(f"sparkflow-exchange: {config.coordinator} (spark.sparkflow.exchange.coordinator) is an "
                         "exchange service without the coordinator role (started with --no-coordinator); point the "
                         "setting at the coordinator (`sparkflow-exchange serve` without --no-coordinator)")
    return {"coordinator": config.coordinator, "secret": "", "host_id": info.get("host_id", ""),
            "pid": info.get("pid", 0), "metrics": ""}


def host_service(config: ExchangeConfig) -> dict | None:
    """This host's running service for the configured coordinator: the ``service`` setting, else the one
    `sparkflow-exchange serve --no-coordinator` registered in this user's runtime directory."""
    secret = config.resolved_secret()
    if config.service:
        ep = Endpoints(config.coordinator, config.service, secret, config.resolved_host_id())
        try:
            with ep.connect(config.service, config, timeout=15.0) as conn:
                return {**conn.call("ping"), "secret": secret}
        except ExchangeError as exc:
            raise SystemExit(f"sparkflow-exchange: this host's exchange service {config.service} "
                             f"(spark.sparkflow.exchange.service) does not answer: {exc}") from None
    return host_service_for(config.coordinator)


def start_command(config: ExchangeConfig) -> str:
    """The command that starts this host's service for the configured coordinator, with the settings this
    executor was given (the ones spark-defaults.conf gives a service started without flags)."""
    parts = ["sparkflow-exchange", "serve", "--no-coordinator", "--coordinator", config.coordinator]
    if config.secret_file:
        parts += ["--secret-file", config.secret_file]
    parts += ["--host", config.bind_host]
    if config.port:
        parts += ["--port", str(config.port)]
    if config.service and config.service.startswith("unix:"):
        parts += ["--unix", config.service.removeprefix("unix:")]
    return shlex.join(parts)


def missing_service_message(config: ExchangeConfig, host: str, found: list[str]) -> str:
    """One line saying which host lacks its service and the exact command to start it there."""
    return (f"sparkflow-exchange: host {host} has no exchange service for the coordinator {config.coordinator}, so "
            f"no executor starts there; start it on {host}: `{start_command(config)}` (or `systemctl start "
            "sparkflow-exchange` with deploy/systemd's unit; docs/deployment.md), or set "
            "spark.sparkflow.exchange.service to its address"
            + (f"; found only {', '.join(found)}" if found else f" (none in {runtime_dir()})"))


def _attach_to_host_service(args: argparse.Namespace, config: ExchangeConfig) -> dict:
    info = host_service(config)
    if info is None:
        others = [f"{f.info.get('tcp')} (reports to {f.info.get('reports_to') or 'none: it is a coordinator'})"
                  for f in running_services() if f.kind == ServiceKind.SERVE]
        raise SystemExit(missing_service_message(config, socket.gethostname(), others))
    write_state(jvm_file(args.jvm_pid), {**info, "pid": args.jvm_pid, "service_pid": info["pid"],
                                          "coordinator_address": config.coordinator, "secret": info.get("secret")})
    return {"service": info["tcp"], "unix": info["unix"], "host_id": info["host_id"], "pid": info["pid"],
            "metrics": _metrics_url(config, info)}


def _metrics_url(config: ExchangeConfig, info: dict) -> str:
    """Where the service's Prometheus text is served on this host ('' when it serves none)."""
    port = info.get("metrics_port") or 0
    if not port:
        return ""
    host = config.metrics_host if config.metrics_host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"


def _detach(args: argparse.Namespace) -> dict:
    try:
        jvm_file(args.jvm_pid).unlink()
    except FileNotFoundError:
        pass
    return {"detached": args.jvm_pid, "swept": sweep_orphan_spill_dirs()}


def _embedded(args: argparse.Namespace) -> dict:
    from .embedded import ensure_embedded

    info = ensure_embedded(ExchangeConfig.load(), timeout=LAUNCHER_PATIENCE, attach_pid=args.jvm_pid)
    return {"unix": info["unix"], "pid": info["pid"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sparkflow_exchange.service.plugin")
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("driver", "executor", "embedded", "detach"):
        p = sub.add_parser(role)
        p.add_argument("--jvm-pid", type=int, required=True)
        if role == "driver":
            p.add_argument("--app-id", default="")
        if role == "executor":
            p.add_argument("--executor-id", default="0")
    args = parser.parse_args(argv)
    handler = {"driver": _driver, "executor": _executor, "embedded": _embedded, "detach": _detach}[args.role]
    try:
        answer = handler(args)
    except UserFacing as exc:  # a bad setting or file (a secret file others may read): one line for the JVM
        raise SystemExit(f"sparkflow-exchange plugin ({args.role}): {exc}") from None
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
