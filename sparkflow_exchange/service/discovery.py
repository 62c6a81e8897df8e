"""Finding the way: which coordinator and which service a process talks to.

Order: explicit settings (``coordinator``, ``service``); a service started for
this host by the Spark plugin or an operator (its state file in the runtime
directory); the embedded default, started on first use in local mode.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import ExchangeConfig
from ..network import auth
from ..network.blocking_client import BlockingConnection, ServiceError
from .exchange_service import default_host_id


@dataclass(frozen=True)
class Endpoints:
    coordinator: str
    service: str  # this host's service, where writers put their partitions
    secret: str | None
    host_id: str

    def connect(self, address: str, config: ExchangeConfig, timeout: float = 30.0) -> BlockingConnection:
        ssl_ctx = None if address.startswith("unix:") else auth.client_ssl_context(config.tls_ca_file, config.tls_cert_file)
        return BlockingConnection(address, self.secret, timeout=timeout, ssl_ctx=ssl_ctx, host_id=self.host_id,
                                  max_frame=config.max_frame_size)


def runtime_dir() -> Path:
    """Per-user directory (0700) holding the embedded service's state and host service files."""
    base = os.environ.get("SPARKFLOW_EXCHANGE_RUNTIME_DIR") or f"/tmp/sparkflow-exchange-{os.getuid()}"
    path = Path(base)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def read_state(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid = info.get("pid")
    if not isinstance(pid, int) or not _alive(pid):
        return None
    return info


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def resolve(config: ExchangeConfig, *, start_embedded: bool = True) -> Endpoints:
    secret = config.resolved_secret()
    host_id = config.host_id or default_host_id()
    if config.coordinator:
        host_info = None if config.service else read_state(runtime_dir() / "host-service.json")
        service = config.service or (_local_address(host_info) if host_info else config.coordinator)
        if host_info and not secret:
            secret = host_info.get("secret")
        return Endpoints(config.coordinator, service, secret, host_info.get("host_id", host_id) if host_info else host_id)
    host_info = read_state(runtime_dir() / "host-service.json")
    if host_info and host_info.get("coordinator_address"):
        return Endpoints(host_info["coordinator_address"], config.service or _local_address(host_info),
                         secret or host_info.get("secret"), host_info.get("host_id", host_id))
    if not start_embedded:
        info = read_state(runtime_dir() / "embedded.json")
        if info is None:
            raise ServiceError("no exchange service is running for this user on this host (nothing to talk to)", "no_service")
    else:
        from .embedded import ensure_embedded

        info = ensure_embedded(config)
    return Endpoints(info["unix"], info["unix"], secret or info.get("secret"), info.get("host_id", host_id))


def _local_address(info: dict) -> str:
    return info.get("unix") or info["tcp"]
