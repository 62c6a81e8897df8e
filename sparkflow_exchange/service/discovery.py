"""Finding the way: which coordinator and which service a process talks to.

Order: explicit settings (``coordinator``, ``service``); the file the Spark
plugin wrote for the JVM above this Python worker (``jvm-<pid>.json`` in the
runtime directory: its executor's service, the coordinator, the secret, the
host identity); the embedded default, started on first use in local mode.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import ExchangeConfig
from ..network import auth
from ..network.blocking_client import BlockingConnection, ServiceError
from .launcher import jvm_pid, read_state
from .private_files import runtime_dir  # noqa: F401 - clients and tests ask for it here


@dataclass(frozen=True)
class Endpoints:
    coordinator: str
    service: str  # this host's service, where writers put their partitions
    secret: str | None
    host_id: str

    def connect(self, address: str, config: ExchangeConfig, timeout: float = 30.0) -> BlockingConnection:
        ssl_ctx = auth.ssl_for(address, config)
        return BlockingConnection(address, self.secret, timeout=timeout, ssl_ctx=ssl_ctx, host_id=self.host_id,
                                  max_frame=config.max_frame_size)


def jvm_file(pid: int) -> Path:
    return runtime_dir() / f"jvm-{pid}.json"


def plugin_state() -> dict | None:
    """What the plugin wrote for the JVM that started this Python worker, if any."""
    pid = jvm_pid()
    if pid is None:
        return None
    return read_state(jvm_file(pid))


def resolve(config: ExchangeConfig, *, start_embedded: bool = True) -> Endpoints:
    secret = config.resolved_secret()
    host_id = config.resolved_host_id()
    plugin = plugin_state()
    if config.coordinator:
        service = config.service or (plugin["unix"] if plugin else config.coordinator)
        if plugin and not secret:
            secret = plugin.get("secret")
        return Endpoints(config.coordinator, service, secret, plugin.get("host_id", host_id) if plugin else host_id)
    if plugin is not None:
        return Endpoints(plugin["coordinator_address"], config.service or plugin["unix"],
                         secret or plugin.get("secret"), plugin.get("host_id", host_id))
    if start_embedded:
        from .embedded import ensure_embedded

        info = ensure_embedded(config)
    else:
        info = read_state(runtime_dir() / "embedded.json")
        if info is None:
            raise ServiceError("no exchange service is running for this user on this host "
                               "(give --address, or start one with `sparkflow-exchange serve`)", "no_service")
    return Endpoints(info["unix"], info["unix"], secret or info.get("secret"), info.get("host_id", host_id))
