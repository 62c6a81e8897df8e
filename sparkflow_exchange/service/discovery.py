"""Finding the way: which coordinator and which service a process talks to.

Order: explicit settings (``coordinator``, ``service``); the file the Spark
plugin wrote for the JVM above this Python worker (``jvm-<pid>.json`` in the
runtime directory: its executor's service, the coordinator, the secret, the
host identity); the embedded default, started on first use in local mode.

Helpers that only ask (listing, dropping, the CLI) use :func:`coordinators`,
which finds what already runs and never starts a service.
"""
from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import ExchangeConfig, settings_sources
from ..errors import ErrorCode, ServiceError, ServiceUnavailable, error_for
from ..network import auth
from ..network.blocking_client import BlockingConnection
from ..network.retry import connect_retrying
from .launcher import jvm_pid, pid_alive, read_state
from .private_files import runtime_dir  # noqa: F401 - clients and tests ask for it here

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoints:
    coordinator: str
    service: str  # this host's service, where writers put their partitions
    secret: str | None
    host_id: str
    retry: float = 0.0  # s to try again a configured coordinator that does not answer (coordinator.retryTimeout)

    def connect(self, address: str, config: ExchangeConfig, timeout: float = 30.0) -> BlockingConnection:
        """A connection to ``address``, asked again for up to ``timeout`` while the service has no room, and
        for up to ``retry`` while the configured coordinator does not answer (it is restarting)."""
        ssl_ctx = auth.ssl_for(address, config)

        def once() -> BlockingConnection:
            return connect_retrying(lambda: BlockingConnection(address, self.secret, timeout=timeout, ssl_ctx=ssl_ctx,
                                                               host_id=self.host_id, max_frame=config.max_frame_size),
                                    timeout)
        if address != self.coordinator or self.retry <= 0:
            return once()
        return _retry_coordinator(once, address, self.retry)


_GONE = (ErrorCode.UNREACHABLE, ErrorCode.CONNECTION_LOST)


def _retry_coordinator(connect: Callable[[], BlockingConnection], address: str, budget: float) -> BlockingConnection:
    deadline = time.monotonic() + budget
    pause = 0.1
    warned = False
    while True:
        try:
            return connect()
        except ServiceError as exc:
            if exc.code not in _GONE:
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise error_for(exc.code, f"{exc}; the coordinator at {address} did not answer for {budget:g} s "
                                          "(coordinator.retryTimeout): is it running? `sparkflow-exchange status "
                                          f"--address {address}` asks it") from None
            if not warned:
                log.warning("the coordinator at %s does not answer (%s); trying again for up to %g s "
                            "(coordinator.retryTimeout)", address, exc, budget)
                warned = True
        time.sleep(min(pause, max(left, 0.0)))
        pause = min(pause * 2, 2.0)


def jvm_file(pid: int) -> Path:
    return runtime_dir() / f"jvm-{pid}.json"


def plugin_state(jvm: int | None = None) -> dict | None:
    """What the plugin wrote for the JVM ``jvm`` (default: the one that started this Python worker), if any."""
    pid = jvm if jvm is not None else jvm_pid()
    if pid is None:
        return None
    return read_state(jvm_file(pid))


class ServiceKind(enum.Enum):
    """Who started a service found in the runtime directory (by its state file's name)."""

    EMBEDDED = "embedded"  # embedded.json
    SERVE = "serve"  # serve-<pid>.json: `sparkflow-exchange serve`
    PLUGIN_COORDINATOR = "plugin coordinator"  # coordinator-<driver pid>.json
    PLUGIN_SERVICE = "plugin service"  # host-service-<key>.json, executor-<pid>.json


_STATE_FILES = (("embedded.json", ServiceKind.EMBEDDED), ("serve-*.json", ServiceKind.SERVE),
                ("coordinator-*.json", ServiceKind.PLUGIN_COORDINATOR),
                ("host-service-*.json", ServiceKind.PLUGIN_SERVICE), ("executor-*.json", ServiceKind.PLUGIN_SERVICE))


@dataclass(frozen=True)
class FoundService:
    kind: ServiceKind
    state_file: Path
    info: dict  # the state file: addresses, pid, secret, host_id, coordinator role

    def endpoints(self, secret: str | None = None) -> Endpoints:
        unix = self.info["unix"]
        return Endpoints(unix, unix, secret or self.info.get("secret"), self.info.get("host_id", ""))


def running_services() -> list[FoundService]:
    """This user's live services on this host, as their state files in the runtime directory name them."""
    found = []
    directory = runtime_dir()
    for pattern, kind in _STATE_FILES:
        for path in sorted(directory.glob(pattern)):
            if ".exchanges." in path.name:  # a coordinator's ledger (ledger.py), not a state file
                continue
            info = read_state(path)
            if info is not None and "unix" in info:
                found.append(FoundService(kind, path, info))
    return found


def coordinators(config: ExchangeConfig, *, jvm: int | None = None) -> list[Endpoints]:
    """The coordinators to ask, never starting one: the ``coordinator`` setting; else the plugin's for
    this worker's JVM (or the driver JVM ``jvm``); else every coordinator running on this host for this
    user (embedded, ``serve``, the plugin's). Empty when none runs."""
    secret = config.resolved_secret()
    host_id = config.resolved_host_id()
    if config.coordinator:
        return [Endpoints(config.coordinator, config.service or config.coordinator, secret, host_id,
                          config.coordinator_retry_timeout)]
    plugin = plugin_state(jvm)
    if plugin is not None:
        return [Endpoints(plugin["coordinator_address"], plugin["unix"], secret or plugin.get("secret"),
                          plugin.get("host_id", host_id))]
    return [found.endpoints(secret) for found in running_services() if found.info.get("coordinator")]


def no_service_message(what: str, elsewhere: str = "set the coordinator setting to one on another host") -> str:
    """Says where it looked: a service of another user (another runtime directory) or a spark-defaults.conf
    that was not where it was looked for shows in it."""
    return (f"no exchange service is running for this user on this host ({what}; none was started to answer): "
            f"{runtime_dir()} (this user's runtime directory, $SPARKFLOW_EXCHANGE_RUNTIME_DIR) names no embedded "
            f"service, none started by `sparkflow-exchange serve` and none of the Spark plugin's, and no "
            f"coordinator is set ({settings_sources()}); {elsewhere}")


_host_services: dict[str, dict] = {}  # coordinator -> this host's service for it, while its pid lives


def host_service_for(coordinator: str) -> dict | None:
    """The service `sparkflow-exchange serve --no-coordinator` runs on this host for ``coordinator`` (its
    state file in this user's runtime directory), or None. Kept while its process lives: every write task
    asks."""
    known = _host_services.get(coordinator)
    if known is not None and pid_alive(known["pid"]):
        return known
    _host_services.pop(coordinator, None)
    for found in running_services():
        if found.kind == ServiceKind.SERVE and found.info.get("reports_to") == coordinator:
            _host_services[coordinator] = found.info
            return found.info
    return None


def resolve(config: ExchangeConfig, *, start_embedded: bool = True) -> Endpoints:
    secret = config.resolved_secret()
    host_id = config.resolved_host_id()
    plugin = plugin_state()
    if config.coordinator:
        if plugin is None and not config.service:  # no plugin: this host's service of the coordinator, if any
            plugin = host_service_for(config.coordinator)
        service = config.service or (plugin["unix"] if plugin else config.coordinator)
        if plugin and not secret:
            secret = plugin.get("secret")
        return Endpoints(config.coordinator, service, secret, plugin.get("host_id", host_id) if plugin else host_id,
                         config.coordinator_retry_timeout)
    if plugin is not None:
        return Endpoints(plugin["coordinator_address"], config.service or plugin["unix"],
                         secret or plugin.get("secret"), plugin.get("host_id", host_id))
    if start_embedded:
        from .embedded import ensure_embedded

        info = ensure_embedded(config)
    else:
        info = read_state(runtime_dir() / "embedded.json")
        if info is None:
            raise ServiceUnavailable("no exchange service is running for this user on this host "
                                     "(give --address, or start one with `sparkflow-exchange serve`)", ErrorCode.NO_SERVICE)
    return Endpoints(info["unix"], info["unix"], secret or info.get("secret"), info.get("host_id", host_id))
