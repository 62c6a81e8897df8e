"""A service's file descriptors, shared out from its open-file limit.

Every fd a service holds is one of: a connection, a finished spill file kept open for reads
(``maxOpenSpillFiles``), a running partition's spill file, or a few of its own (listeners, log, the
reserve fd of each listener). The caps it is configured with are lowered to fit the limit, so its
caches never take the fds its connections need: the spill read cache gets at most a quarter of what
is left after a fixed reserve, connections half, strangers (connections not authenticated yet) an
eighth, and the last quarter stays for running partitions. A service at its limit still refuses
clearly (``network/listener.py``); these bounds make that rare.
"""
from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from ..config import ExchangeConfig

log = logging.getLogger(__name__)

RESERVED = 32  # the interpreter's own, listeners and their reserve fds, log, state and lock files


def raise_nofile_limit() -> int:
    """Raise the soft open-file limit to the hard one (as servers do) and return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return min(soft, hard) if soft != resource.RLIM_INFINITY else hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    except (ValueError, OSError):
        return soft


@dataclass(frozen=True)
class FdBudget:
    limit: int
    spill_reads: int
    connections: int
    strangers: int
    strangers_per_peer: int

    notes: dict  # key -> " (configured N, lowered to fit the open-file limit L)" for each cap it lowered


def fd_budget(config: ExchangeConfig, limit: int) -> FdBudget:
    """The caps of a service with open-file limit ``limit``: the configured ones, lowered to fit it."""
    usable = max(limit - RESERVED, 16)  # at least 4 connections, 2 of them strangers, 4 spill reads
    caps = {
        "maxOpenSpillFiles": (config.max_open_spill_files, min(config.max_open_spill_files, usable // 4)),
        "maxConnections": (config.max_connections, min(config.max_connections, usable // 2)),
        "maxUnauthenticatedConnections": (config.max_unauthenticated_connections,
                                          min(config.max_unauthenticated_connections, usable // 8)),
        "maxUnauthenticatedPerPeer": (config.max_unauthenticated_per_peer,
                                      min(config.max_unauthenticated_per_peer, usable // 8)),
    }
    lowered = [key for key, (configured, used) in caps.items() if used < configured]
    budget = FdBudget(
        limit=limit,
        spill_reads=caps["maxOpenSpillFiles"][1],
        connections=caps["maxConnections"][1],
        strangers=caps["maxUnauthenticatedConnections"][1],
        strangers_per_peer=caps["maxUnauthenticatedPerPeer"][1],
        notes={key: f" (configured {caps[key][0]}, lowered to fit the open-file limit {limit})" for key in lowered},
    )
    if lowered:
        log.warning("open-file limit %d: %s lowered to fit it (spill reads %d, connections %d, strangers %d); "
                    "raise the limit (ulimit -n) to serve more", limit, ", ".join(lowered), budget.spill_reads,
                    budget.connections, budget.strangers)
    return budget
