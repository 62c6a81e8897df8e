"""A service's side of the coordinator's registry: register, then a heartbeat every ``heartbeatInterval``.

A service that holds partitions for a coordinator elsewhere (``serve --no-coordinator``, the Spark
plugin's executor services) keeps one connection to it. When the connection breaks (the coordinator
restarts, the network fails) or the coordinator no longer knows it (it restarted, or declared this
service lost), it connects and registers again, trying every interval until the coordinator is back. The
coordinator answers a registration with the partitions it knows there; finished ones it does not know
(their exchange was dropped, lost or aborted while this service could not be told) are freed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from ..config import ExchangeConfig
from ..errors import ServiceError
from ..network import auth
from ..network.aio_client import ClientConnection, open_connection

log = logging.getLogger(__name__)


class ReportingService(Protocol):
    """What the heartbeat needs of the service it reports for (``ExchangeService``)."""

    config: ExchangeConfig
    stopping: asyncio.Event
    secret: str | None
    host_id: str
    service_id: str

    def addresses(self) -> dict: ...

    def release_unknown(self, known: set[str], coordinator: str) -> list[str]: ...


async def report_to_coordinator(service: ReportingService, address: str,
                                first: asyncio.Future | None = None) -> None:
    """Register, heartbeat, register again, until the service stops. ``first`` is resolved once the first
    registration was answered or failed: the coordinator accepts producers here only once we registered."""
    config = service.config
    interval = config.heartbeat_interval
    conn: ClientConnection | None = None
    registered = False
    outage: str | None = None  # why the coordinator could not be reached (logged once per outage)
    while not service.stopping.is_set():
        try:
            if conn is None or not conn.alive:
                conn = await open_connection(address, service.secret, host_id=service.host_id,
                                             ssl_ctx=auth.ssl_for(address, config), timeout=max(interval, 5.0),
                                             max_frame=config.max_frame_size)
                registered = False
            if not registered:
                a = service.addresses()
                answer = await conn.rpc("register_service", {"service_id": service.service_id,
                                                             "host_id": service.host_id, "tcp": a["tcp"],
                                                             "unix": a["unix"], "pid": a["pid"]},
                                        timeout=max(interval * 5, 10.0))
                registered = True
                freed = service.release_unknown(set(answer.get("partitions", ())), address)
                if freed:
                    log.warning("released %d finished partitions the coordinator at %s no longer knows",
                                len(freed), address)
                log.log(logging.WARNING if outage else logging.INFO, "registered with the coordinator at %s%s",
                        address, f" again (it could not be reached: {outage})" if outage else "")
                outage = None
                if first is not None and not first.done():
                    first.set_result(True)
            else:
                answer = await conn.rpc("service_heartbeat", {"service_id": service.service_id},
                                        timeout=max(interval * 5, 10.0))
                if not answer.get("known"):
                    registered = False  # the coordinator restarted, or declared us lost: say we are here
                    continue
        except (ServiceError, OSError, asyncio.TimeoutError) as exc:
            if outage is None:
                log.warning("the coordinator at %s cannot be reached (%s); trying again every %g s", address,
                            exc or type(exc).__name__, interval)
            outage = str(exc) or type(exc).__name__
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            conn = None
            if first is not None and not first.done():
                first.set_result(False)
        try:
            await asyncio.wait_for(service.stopping.wait(), interval)
        except asyncio.TimeoutError:
            pass
    if conn is not None and conn.transport is not None:
        conn.transport.close()
