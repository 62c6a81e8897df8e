"""Freeing partitions: here, or by asking the service that holds them.

The coordinator releases an exchange's partitions wherever they live (a drop, an overwrite, a lost
commit, expiry); a credential frees only what it registered; a writer lost before it joined its
exchange has its partition freed after a moment; a coordinator that no longer knows a partition has
it freed when this service registers again.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from ..errors import ErrorCode
from ..network import auth

if TYPE_CHECKING:
    from ..config import ExchangeConfig
    from ..partition.result_partition import ResultPartition
    from .coordinator import Coordinator

log = logging.getLogger(__name__)

JOIN_GRACE = 1.0  # s after a writer is lost before its partition is released if it never joined its exchange


class Holder(Protocol):
    """What releasing needs of the service that holds the partitions (``exchange_service.py``)."""

    service_id: str
    secret: str | None
    config: ExchangeConfig
    partitions: dict[str, ResultPartition]
    coordinator: Coordinator | None


class PartitionReleases:
    def __init__(self, service: Holder) -> None:
        self.service = service

    def producer_lost(self, part: ResultPartition, reason: str) -> None:
        if part.finished:  # its rows are complete: a failure told after the end changes nothing
            return
        part.fail(reason)
        if self.service.coordinator is not None:
            if part.exchange:
                asyncio.ensure_future(self.service.coordinator.writes.holder_reports_failure(
                    part.exchange, part.pid, reason, self.service.service_id, part.owner))
            # a writer lost before it joined its exchange (killed between registering its partition and
            # register_producer): no reader can learn of the partition and no drop will release it. Asked a
            # moment later, so a register_producer already on its way is counted. One with no exchange label
            # joins none: it goes too.
            asyncio.get_running_loop().call_later(JOIN_GRACE, self.release_if_unjoined, part, reason)

    def release_unknown(self, known: set[str], coordinator: str) -> list[str]:
        """Free the finished (or failed) partitions the coordinator did not name as held here (``known``):
        nobody can find them any more. One still written is left alone (its producer may not have joined)."""
        gone = [pid for pid, part in self.service.partitions.items()
                if (part.finished or part.failure is not None) and pid not in known]
        for pid in gone:
            self.release_partition(pid, f"the coordinator at {coordinator} no longer knows it (its exchange was "
                                        "dropped, lost or aborted while this service could not be told)")
        return gone

    def release_if_unjoined(self, part: ResultPartition, reason: str) -> None:
        exchange = self.service.coordinator.exchanges.get(part.exchange)
        if self.service.partitions.get(part.pid) is part and (exchange is None or part.pid not in exchange.producers):
            self.release_partition(part.pid, f"its writer was lost before it joined exchange {part.exchange!r}: "
                                             f"{reason}")

    def release_partition(self, pid: str, reason: str = "released by the coordinator",
                          code: ErrorCode = ErrorCode.RELEASED) -> bool:
        """Free a partition; readers connected to it, and its writer if it still writes, hear ``reason`` at once
        (``code``: ``replaced`` when the exchange went)."""
        part = self.service.partitions.pop(pid, None)
        if part is None:
            return False
        part.release(reason, code)
        return True

    def release(self, targets: list[tuple[dict, str, str]], reason: str = "released by the coordinator",
                 code: ErrorCode = ErrorCode.RELEASED) -> None:
        """Coordinator callback: free partitions here, or ask the service that holds them.

        Another service is dialed (with the operator's secret) only at the address it registered under the
        id the location names, and must greet as that service: an address a client chose is never dialed.
        Each target names the credential that joined it to its exchange: only a partition that credential
        registered is freed (a producer naming another's partition releases nothing of it)."""
        remote: dict[tuple[str, str], list[str]] = {}
        for location, pid, owner in targets:
            sid = location.get("service_id")
            if sid == self.service.service_id:
                self.release_owned([pid], owner, reason, code)
            elif isinstance(sid, str):
                remote.setdefault((sid, owner), []).append(pid)
        registry = self.service.coordinator.services.services if self.service.coordinator is not None else {}
        for (sid, owner), pids in remote.items():
            record = registry.get(sid)
            if record is None or not record.tcp:  # forgotten: it frees them when it registers again (or at ttl)
                log.warning("could not release %d partitions on exchange service %s: it is not registered",
                            len(pids), sid)
                continue
            asyncio.ensure_future(self._release_remote(record.tcp, sid, pids, reason, code, owner))

    def release_owned(self, pids: list[str], owner: str, reason: str, code: ErrorCode = ErrorCode.RELEASED) -> int:
        """Free the partitions among ``pids`` that ``owner`` registered (every one for the operator or "")."""
        released = 0
        for pid in pids:
            part = self.service.partitions.get(pid)
            if part is None:
                continue
            if owner and owner not in (auth.OPERATOR, part.owner):
                log.warning("partition %s was not released for credential %r: credential %r registered it", pid,
                            owner, part.owner)
                continue
            released += self.release_partition(pid, reason, code)
        return released

    async def _release_remote(self, address: str, service_id: str, pids: list[str], reason: str,
                              code: ErrorCode, owner: str = "") -> None:
        from ..network.aio_client import rpc_once

        try:
            # the operator's (a deployment with one secret) goes without: a service of an earlier version frees them
            behalf = {"on_behalf_of": owner} if owner and owner != auth.OPERATOR else {}
            await rpc_once(address, self.service.secret, self.service.config, "release_partitions",
                           {"partitions": pids, "reason": reason, "code": code, **behalf}, expect_service=service_id)
        except Exception as exc:  # noqa: BLE001 - best effort: the other service's TTL frees them too
            log.warning("could not release %d partitions on %s: %s", len(pids), address, exc)
