"""A service's status: what it holds and serves, for the ``status`` RPC, the CLI and the metrics."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from . import spill_root

if TYPE_CHECKING:
    from ..network.admission import Admission
    from ..network.listener import Listener
    from ..partition.buffer_pool import MemoryAccount, NetworkBufferPool
    from ..partition.result_partition import ResultPartition
    from ..partition.spill import DiskBudget, DiskShare, SpillReaders
    from .coordinator import Coordinator
    from .streams import StreamRegistry


class Described(Protocol):
    """What the status reads of the service (``exchange_service.py``)."""

    connections: Any  # the live server connections
    partitions: dict[str, ResultPartition]
    budget: NetworkBufferPool
    spill_readers: SpillReaders
    admission: Admission
    listeners: list[Listener]
    coordinator: Coordinator | None
    streams: StreamRegistry | None
    traffic: dict[str, int]
    apps: dict[str, int]
    leftover: dict[str, int]
    disk: DiskBudget
    spill_dir: Path
    spill_root: Path
    memory_accounts: dict[str, MemoryAccount]

    def addresses(self) -> dict[str, Any]: ...

    def shares_of(self, owner: str) -> tuple[MemoryAccount | None, DiskBudget | DiskShare]: ...


def service_status(service: Described) -> dict[str, Any]:
    """Everything the service holds and serves: memory, disk, credentials, partitions, channels, connections,
    exchanges, services, traffic."""
    channels = []
    for conn in service.connections:
        for rid, view in conn.queue.views().items():
            channels.append({
                "receiver_id": rid,
                "client": conn.client_id,
                "client_host": conn.client_host,
                "transport": conn.transport_kind,
                "locality": conn.locality,
                "partition": view.sub.partition.pid,
                "subpartition": view.sub.index,
                "credit": conn.queue.credit_of(rid),
                "backlog": view.backlog(),
                "position": view.pos,
                "bytes_sent": conn.channel_bytes.get(rid, 0),
            })
    ratios = {prod.partition.pid: prod.backpressure_ratio() for c in service.connections for prod in c.producers.values()}
    partitions = []
    by_exchange: dict[str, dict[str, int]] = {}  # what this service holds of each exchange, and its reads
    for part in service.partitions.values():
        stats = part.stats()
        stats["backpressure_ratio"] = round(ratios.get(part.pid, 0.0), 4)
        partitions.append(stats)
        held = by_exchange.setdefault(part.exchange, {"partitions": 0, "bytes_written": 0, "raw_bytes_written": 0, "bytes_read": 0,
                                                      "buffers_read": 0, "file_bytes_read": 0})
        held["partitions"] += 1
        held["bytes_written"] += part.bytes_in
        held["raw_bytes_written"] += part.raw_bytes_in
        held["bytes_read"] += part.bytes_read
        held["buffers_read"] += part.buffers_read
        held["file_bytes_read"] += part.file_bytes_read
    return {
        "service": service.addresses(),
        "memory": {"budget": service.budget.total_bytes, "reserved": service.budget.reserved_bytes,
                   "used": service.budget.used_bytes, "promised": service.budget.promised_bytes,
                   "peak_used": service.budget.peak_used_bytes, "peak_reserved": service.budget.peak_reserved_bytes,
                   "bookkeeping": service.budget.bookkeeping_bytes,
                   "running_pools": len(service.budget.pools), "open_spill_reads": len(service.spill_readers)},
        "disk": _disk_status(service),
        # what each application credential holds of its shares (the operator has none)
        "credentials": _credential_holdings(service),
        "partitions": partitions,
        "channels": channels,
        "strangers": service.admission.strangers,  # connections that have not authenticated (own user's aside)
        # connections refused for want of room: a cap full, or out of file descriptors
        "refused_connections": service.admission.refused + sum(listener.refused for listener in service.listeners),
        "connections": [
            {"client": c.client_id, "client_host": c.client_host, "transport": c.transport_kind,
             "credential": c.identity, "bytes_sent": c.bytes_sent, "bytes_received": c.bytes_received,
             "file_bytes_sent": c.file_bytes_sent}  # of bytes_sent: straight from spill files (sendfile)
            for c in service.connections
        ],
        "exchanges": service.coordinator.list() + service.streams.list() if service.coordinator else [],
        # the coordinator's registry: every service holding partitions for it, by host (registry.py)
        "services": service.coordinator.services.describe() if service.coordinator else [],
        "traffic": dict(service.traffic),
        "exchange_traffic": by_exchange,
        "apps": dict(service.apps),
    }


def _disk_status(service: Described) -> dict[str, Any]:
    """What the spill files take, as counted and as found on disk (the root's too: live neighbours and
    dead services' leftovers). A leftover the operator removed since stops counting."""
    for path, nbytes in list(service.leftover.items()):
        now = spill_root.tree_bytes(Path(path)) if os.path.isdir(path) else 0
        service.disk.used = max(0, service.disk.used + now - nbytes)
        if now:
            service.leftover[path] = now
        else:
            del service.leftover[path]
    return {"limit": service.disk.limit, "used": service.disk.used, "spill_dir": str(service.spill_dir),
            "on_disk": spill_root.tree_bytes(service.spill_dir), "leftover": sum(service.leftover.values()),
            "leftover_dirs": sorted(service.leftover), "root": str(service.spill_root),
            "root_bytes": spill_root.root_bytes(service.spill_root)}


def _credential_holdings(service: Described) -> dict[str, dict[str, int]]:
    """Per application credential that connected or holds partitions: its connections and shares."""
    out = {}
    for name in sorted(set(service.memory_accounts) | set(service.admission.credentials())):
        account, disk = service.shares_of(name)
        out[name] = {"connections": service.admission.connections_of(name), "memory": account.bytes,
                     "memory_limit": account.limit, "disk": disk.used, "disk_limit": disk.limit}
    return out
