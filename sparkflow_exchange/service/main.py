"""Run an exchange service process: ``sparkflow-exchange serve`` / ``python -m sparkflow_exchange.service``."""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
import threading
from pathlib import Path

from ..config import ConfigError, ExchangeConfig, settings_sources
from ..errors import UserFacing
from ..network import auth
from .exchange_service import ExchangeService
from .fd_budget import raise_nofile_limit
from .launcher import Retirement, read_state, write_state
from .ledger import ExchangeLedger
from .log_limit import install as limit_log_rate
from .private_files import UnsafePathError, runtime_dir, write_private


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1, or bindHost)")
    parser.add_argument("--port", type=int, help="TCP port (default: ephemeral)")
    parser.add_argument("--advertised-host", help="address or name other hosts reach this service at (default: "
                        "--host, or when it listens on every interface: SPARK_LOCAL_IP, else the address of "
                        "the interface that routes to the coordinator, else a non-loopback interface's)")
    parser.add_argument("--driver-host", help=argparse.SUPPRESS)  # spark.driver.host, from the plugin's driver launcher
    parser.add_argument("--unix", help="Unix socket path (default: inside the spill directory)")
    parser.add_argument("--no-coordinator", action="store_true", help="serve partitions only; the coordinator runs elsewhere")
    parser.add_argument("--coordinator", help="with --no-coordinator: the coordinator (host:port) to register with and "
                                              "send heartbeats to (default: the coordinator setting, e.g. from "
                                              "spark-defaults.conf)")
    parser.add_argument("--state-dir", help="the coordinator keeps its exchanges here and takes them up again when it "
                                            "restarts (stateDir)")
    parser.add_argument("--secret-file", help="file with the shared secret (default: a fresh one, written beside the spill files)")
    parser.add_argument("--insecure", action="store_true", help="accept clients without a secret, each of them the "
                        "operator (loopback experiments only)")
    parser.add_argument("--insecure-beyond-loopback", action="store_true",
                        help="with --insecure: listen on a non-loopback address anyway, where anyone who can reach "
                             "the port is the operator (refused without this flag)")
    parser.add_argument("--spill-dir", help="directory for spill files")
    parser.add_argument("--host-id", help="host identity (default: the hostname)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this HTTP port")
    parser.add_argument("--metrics", action="store_true",
                        help="serve Prometheus metrics on an ephemeral port when no --metrics-port/metricsPort is set")
    parser.add_argument("--embedded", action="store_true", help="exit once no attached application is alive")
    parser.add_argument("--hold-exchanges", action="store_true",
                        help="with --embedded: stay up while any exchange is held (until dropped or expired after ttl)")
    parser.add_argument("--state-file", help="write the service's addresses (and secret) here, mode 0600")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="any spark.sparkflow.exchange.<KEY> setting")


def config_from_args(args: argparse.Namespace) -> ExchangeConfig:
    overrides: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--conf needs KEY=VALUE, got {item!r}")
        overrides[key.removeprefix("spark.sparkflow.exchange.")] = value
    for flag, key in (("host", "bindHost"), ("advertised_host", "advertisedHost"), ("port", "port"),
                      ("spill_dir", "spillDir"), ("host_id", "hostId"), ("secret_file", "secretFile"),
                      ("metrics_port", "metricsPort"), ("coordinator", "coordinator"), ("state_dir", "stateDir")):
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    return ExchangeConfig.load(overrides)


async def run(args: argparse.Namespace) -> None:
    config = config_from_args(args)
    secret = config.service_secret()
    configured_secret = secret
    if not secret and not args.insecure:
        secret = auth.new_secret()
    if not secret:
        check_insecure_host(config.bind_host, args.insecure_beyond_loopback)
    if args.state_file and not Path(args.state_file).parent.is_dir():
        raise ConfigError(f"--state-file {args.state_file}: its directory does not exist")
    retiring = Retirement(Path(args.state_file)) if args.state_file else None
    try:
        service = ExchangeService(config, coordinator=not args.no_coordinator, unix_path=args.unix,
                                  secret=secret or None, attach_mode=args.embedded, hold_exchanges=args.hold_exchanges,
                                  retire=retiring.begin if retiring is not None else None,
                                  serve_metrics=args.metrics, driver_host=args.driver_host)
    except OSError as exc:  # e.g. a spill directory it cannot make: one line that names it
        raise ConfigError(f"cannot start: {exc}") from None
    try:
        registered, ledger, info = await _start(service, config, args, secret, configured_secret)
    except BaseException as exc:  # e.g. a path at --unix it may not replace: what it made goes, nothing else
        await service.shutdown()
        if isinstance(exc, OSError):  # a file or directory it cannot use: one line that names it
            raise ConfigError(f"cannot start: {exc}") from None
        raise
    announce(config, args, service, fresh_secret=bool(secret) and not configured_secret)
    print(json.dumps(info), flush=True)
    preload(WRITE_PATH_MODULES)
    try:
        await service.serve_until_stopped()
    finally:
        if ledger is not None:
            # an embedded service stops with exchanges only when told to: their readers hear they were lost
            held = sorted({*service.coordinator.exchanges, *service.streams.streams}) if args.hold_exchanges else []
            ledger.close(service.coordinator.lost, held)
        if retiring is not None:
            retiring.finish()
        if registered is not None:
            registered.unlink(missing_ok=True)


async def _start(service: ExchangeService, config: ExchangeConfig, args: argparse.Namespace, secret: str | None,
                 configured_secret: str | None) -> tuple[Path | None, ExchangeLedger | None, dict]:
    """Start listening, take up the state directory and write the files that tell clients where it is."""
    await service.start()
    if config.state_dir and service.coordinator is not None:  # before anyone learns our address
        from .journal import Journal

        restored = await service.coordinator.restore(Journal(config.state_dir))
        logging.getLogger(__name__).info("took up %d exchanges from the state directory %s", restored,
                                         config.state_dir)
    ledger = None
    if args.state_file and service.coordinator is not None:  # before the state file: readers come after it
        ledger = ExchangeLedger(Path(args.state_file).with_suffix(".exchanges.json"))
        service.coordinator.lost = ledger.take_over()
        service.coordinator.watch_names(ledger.record)
        ledger.record([], service.coordinator.lost)
    generated_secret_file = None
    if secret and not configured_secret:
        generated_secret_file = str(service.spill_dir / "secret")
        write_private(generated_secret_file, secret)
        service.own_files.append(Path(generated_secret_file))  # removed when it stops
    info = service.addresses()
    info["secret_file"] = generated_secret_file or config.secret_file
    if args.state_file:
        write_state(args.state_file, {**info, "secret": secret})
    registered = None if args.state_file else register_serve({**info, "secret": secret})
    return registered, ledger, info


# What a write's first commit needs that the service's start leaves out (it is ready about 45 ms sooner without):
# numpy, for the sizes each finished producer reports. Imported on a thread once the service is ready, while no
# write runs yet; left to the first write, its import (0.1-0.15 s, holding the interpreter) sat inside the first
# producer's commit and held up every other connection of the service meanwhile.
WRITE_PATH_MODULES = ("numpy",)


def preload(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` on a daemon thread (best effort: a module that fails to import is imported, and
    fails, where it is used), so that no request waits for them."""
    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the caller's own import says what is wrong
                pass

    thread = threading.Thread(target=run, name="sparkflow-exchange-preload", daemon=True)
    thread.start()
    return thread


_FLAGS = ("host", "port", "advertised_host", "unix", "coordinator", "state_dir", "secret_file", "spill_dir",
          "host_id", "metrics_port")


def announce(config: ExchangeConfig, args: argparse.Namespace, service: ExchangeService, *, fresh_secret: bool) -> None:
    """One line on stderr at every start saying what configuration was read (the service runs with what it
    found, and a conf that was not where it was looked for shows), and a warning when a host that looks
    like a cluster node got settings only a single host can use (loopback, a secret nobody else knows)."""
    flags = [f"--{name.replace('_', '-')}" for name in _FLAGS if getattr(args, name, None) is not None]
    flags += [f"--conf {item.partition('=')[0]}" for item in args.conf]
    role = ("is the coordinator" if service.coordinator is not None
            else f"reports to the coordinator {config.coordinator}" if config.coordinator else "reports to no coordinator")
    secret = (f"a fresh random secret (in {service.spill_dir / 'secret'})" if fresh_secret
              else f"secretFile {config.secret_file}" if config.secret_file
              else "no secret (--insecure)" if not service.secret else "the secret setting")
    line = (f"settings from {settings_sources()}, command line {' '.join(flags) if flags else '(no settings)'}; "
            f"listens on {config.bind_host or '127.0.0.1'} (bindHost), {role}, {secret}")
    log = logging.getLogger(__name__)
    if args.embedded:  # started for applications by a launcher (loopback and its own secret are meant): its
        log.info("%s", line)  # log stays empty, and goes when it exits, unless something went wrong
        return
    print(f"sparkflow-exchange serve: {line}", file=sys.stderr, flush=True)
    if service.coordinator is None and not config.coordinator:  # a worker host's command, its conf unread
        log.warning("--no-coordinator without a coordinator: this service reports to none, so no application "
                    "learns of it; give --coordinator HOST:PORT or spark.sparkflow.exchange.coordinator in the "
                    "spark-defaults.conf it should read (settings from %s)", settings_sources())
    signs = []  # what makes this look like one host of a cluster
    coordinator_host = config.coordinator.rsplit(":", 1)[0].strip("[]") if config.coordinator else ""
    if service.coordinator is None and coordinator_host and not _loopback_only(coordinator_host):
        signs.append(f"reports to the coordinator {config.coordinator}")
    if config.advertised_host and not _loopback_only(config.advertised_host):
        signs.append(f"advertises {config.advertised_host}")
    loopback = _loopback_only(config.bind_host or "127.0.0.1")
    if loopback and signs:
        log.warning("listening on loopback (%s) only although it %s: no other host can reach it; give --host "
                    "0.0.0.0 (or bindHost) to serve the cluster (settings from %s)",
                    config.bind_host or "127.0.0.1", " and ".join(signs), settings_sources())
    if not loopback:
        signs.append(f"listens on {config.bind_host}")
    if fresh_secret and signs:
        log.warning("using a fresh random secret no other host knows although it %s: clients and services "
                    "elsewhere cannot authenticate; give --secret-file (secretFile) the cluster's secret file "
                    "(settings from %s)", " and ".join(signs), settings_sources())


def check_insecure_host(bind_host: str, allowed: bool) -> None:
    """A service without a secret makes every client the operator: on loopback only that host's users reach
    it; elsewhere anyone who reaches the port does, so that takes a flag of its own (and still a warning)."""
    if _loopback_only(bind_host):
        return
    why = (f"--insecure on {bind_host}: with no secret anyone who can reach this port is the operator (reads, "
           "changes and drops every exchange, stops the service)")
    if not allowed:
        raise ConfigError(f"{why}; listen on loopback (--host 127.0.0.1), give a --secret-file, or add "
                          "--insecure-beyond-loopback if that is really meant")
    logging.getLogger(__name__).warning("%s (--insecure-beyond-loopback)", why)


def _loopback_only(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (a name that does not resolve is not)."""
    import ipaddress
    import socket

    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP) if host else []
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def register_serve(info: dict) -> Path | None:
    """A service run by hand leaves its addresses (and secret, 0600) in this user's runtime directory, so
    the CLI and the helpers on this host find it (``discovery.running_services``); stale ones are swept."""
    try:
        directory = runtime_dir()
        for stale in directory.glob("serve-*.json"):
            if read_state(stale) is None:
                stale.unlink(missing_ok=True)
        path = directory / f"serve-{os.getpid()}.json"
        write_state(path, info)
        return path
    except (OSError, UnsafePathError) as exc:  # e.g. an unsafe runtime directory: the service runs, the CLI needs --address
        logging.getLogger(__name__).warning("not registered in the runtime directory: %s", exc)
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sparkflow-exchange serve", description=__doc__)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("SPARKFLOW_EXCHANGE_LOG", "WARNING"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        limit_log_rate(handler)
    raise_nofile_limit()
    tune_gc()
    try:
        asyncio.run(run(args))
    except UserFacing as exc:  # a bad setting or file, found at start: one line, no traceback
        raise SystemExit(f"sparkflow-exchange serve: {exc}") from None


# Allocations between young collections. A service holding a few 200 x 200 exchanges keeps some 10^5
# long-lived objects (subpartitions, their buffers' entries); with CPython's default (700) it ran a young
# collection every few write tasks and full ones taking up to 0.2 s each, stalling every writer and reader
# (measured: 1.6 s of collection per 600 write tasks). Its garbage is mostly freed by reference counting;
# cycles still get collected, just less often.
GC_YOUNG_THRESHOLD = 100_000


def tune_gc() -> None:
    import gc

    gc.freeze()  # what start-up imported is never garbage: later collections skip it
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


if __name__ == "__main__":
    main()
