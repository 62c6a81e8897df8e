"""The coordinator's registry of exchange services: who holds partitions, and who stopped answering.

Services that serve partitions for a coordinator elsewhere (``serve --no-coordinator``, the Spark
plugin's) register with it and then send a heartbeat every ``heartbeatInterval``. One that has sent
nothing for ``heartbeatTimeout`` is *lost* (time the coordinator's own loop was stalled does not count:
heartbeats may be waiting unread), as is one whose address is taken over by a newly
registered process (a restarted service: the old one's data went with it). The coordinator then
marks the exchanges that had partitions there lost (``coordinator.Coordinator.services_lost``). A lost
record stays listed for ``lostServiceRetention`` after it was declared lost (its wall-clock time is kept,
across coordinator restarts too), then it is forgotten.

Sans-IO: it only keeps records and is told the time; the service's event loop calls it.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..kinds import ServiceState


@dataclass
class ServiceRecord:
    service_id: str
    host_id: str
    tcp: str
    unix: str
    pid: int
    registered: float  # epoch seconds of its last registration (again after a coordinator restart)
    last_seen: float  # the registry clock (monotonic) at its last heartbeat
    state: ServiceState = ServiceState.ALIVE
    lost_reason: str = ""
    lost_at: float = 0.0  # epoch seconds it was declared lost

    def where(self) -> str:
        """The service as a message names it: its host first (what an operator looks for)."""
        return f"the exchange service {self.service_id} on host {self.host_id} ({self.tcp}, pid {self.pid})"

    def location(self) -> dict[str, Any]:
        """Where its partitions are read and released: the addresses it registered, never a writer's say."""
        return {"service_id": self.service_id, "host_id": self.host_id, "tcp": self.tcp, "unix": self.unix,
                "pid": self.pid}

    def describe(self, now: float) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state
        out["seen_ago"] = round(max(0.0, now - self.last_seen), 3)
        del out["last_seen"]
        return out


CHECK_PERIOD = 0.5  # s between two expire() calls (the service's housekeeping); more is time our loop stalled


class ServiceRegistry:
    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        """``clock``: heartbeats' time (monotonic); ``wall``: registrations' and losses' (epoch seconds)."""
        self.timeout = timeout
        self.clock = clock
        self.wall = wall
        self.services: dict[str, ServiceRecord] = {}
        self._checked: float | None = None  # the clock at the last expire()

    def register(self, service_id: str, host_id: str, tcp: str, unix: str, pid: int) -> list[ServiceRecord]:
        """Record a service (again, after a coordinator restart or a broken connection); returns the
        records it makes lost: another process that had registered the same TCP address."""
        now = self.clock()
        replaced = []
        for other in self.services.values():
            if other.service_id != service_id and other.tcp == tcp and other.state == ServiceState.ALIVE:
                other.state = ServiceState.LOST
                other.lost_at = self.wall()
                other.lost_reason = (f"a new exchange service ({service_id}, pid {pid}) registered at its address "
                                     f"{tcp}: it was restarted, and what it held went with the old process")
                replaced.append(other)
        record = self.services.get(service_id)
        if record is None or record.state == ServiceState.LOST:
            record = self.services[service_id] = ServiceRecord(service_id, host_id, tcp, unix, pid, self.wall(), now)
        else:
            record.host_id, record.tcp, record.unix, record.pid = host_id, tcp, unix, pid
            record.last_seen, record.registered = now, self.wall()
        return replaced

    def heartbeat(self, service_id: str) -> bool:
        """A live service's heartbeat; False when it is unknown or was declared lost (it must register)."""
        record = self.services.get(service_id)
        if record is None or record.state != ServiceState.ALIVE:
            return False
        record.last_seen = self.clock()
        return True

    def expire(self) -> list[ServiceRecord]:
        """Declare lost the services silent for longer than the timeout; returns them."""
        now = self.clock()
        stalled = 0.0 if self._checked is None else now - self._checked - CHECK_PERIOD
        self._checked = now
        if stalled > 0:  # our own loop ran late: heartbeats may have waited unread that long
            for record in self.services.values():
                record.last_seen = min(now, record.last_seen + stalled)
        lost = []
        for record in self.services.values():
            if record.state == ServiceState.ALIVE and now - record.last_seen > self.timeout:
                record.state = ServiceState.LOST
                record.lost_at = self.wall()
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.lost_at))
                record.lost_reason = (f"it sent no heartbeat for {now - record.last_seen:.1f} s (heartbeatTimeout="
                                      f"{self.timeout:g} s; declared lost at {when}): stopped, killed, or its host "
                                      "is down")
                lost.append(record)
        return lost

    def forget_lost(self, retention: float) -> list[ServiceRecord]:
        """Drop the records declared lost more than ``retention`` seconds ago; returns them."""
        cutoff = self.wall() - retention
        gone = [r for r in self.services.values() if r.state == ServiceState.LOST and r.lost_at <= cutoff]
        for record in gone:
            del self.services[record.service_id]
        return gone

    def describe(self) -> list[dict[str, Any]]:
        now = self.clock()
        return sorted((r.describe(now) for r in self.services.values()), key=lambda d: (d["host_id"], d["tcp"]))

    # ------------------------------------------------------------ the state directory (journal.py)
    def snapshot(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in asdict(r).items() if k != "last_seen"} for r in self.services.values()]

    def restore(self, records: list[dict[str, Any]]) -> None:
        """Records from before a coordinator restart: each alive one gets a full timeout to register again."""
        now = self.clock()
        for data in records:
            try:
                record = ServiceRecord(str(data["service_id"]), str(data["host_id"]), str(data["tcp"]),
                                       str(data.get("unix", "")), int(data["pid"]), float(data["registered"]), now,
                                       ServiceState(data.get("state", ServiceState.ALIVE)),
                                       str(data.get("lost_reason", "")),
                                       float(data.get("lost_at", data["registered"])))
            except (KeyError, ValueError, TypeError):
                continue
            self.services[record.service_id] = record
