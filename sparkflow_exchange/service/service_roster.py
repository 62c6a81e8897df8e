"""The coordinator's service role: the exchange services that hold partitions for it, and what their loss costs.

Services register (at start, and again whenever they lost the coordinator) and send heartbeats
(``registry.py`` keeps the records). A service silent for heartbeatTimeout is lost: an exchange with a
committed partition there is lost with it (its lifecycle's ``lose``), a running producer there failed.
A producer's location is only ever what a registered service said it is.
"""
from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

from ..errors import ErrorCode, ServiceError
from ..kinds import PartitionState, ServiceState
from .exchange_book import ExchangeBook
from .exchange_lifecycle import Action, Event, ReplicaState, after_loss
from .exchanges import Exchange, ProducerInfo
from .registry import ServiceRecord, ServiceRegistry

log = logging.getLogger(__name__)

FailProducer = Callable[[str, "int | None", str, str], Awaitable[dict]]  # (name, epoch, partition, reason)


class ServiceRoster:
    def __init__(self, book: ExchangeBook, fail_producer: FailProducer, heartbeat_timeout: float = 10.0,
                 lost_retention: float = 600.0) -> None:
        self.book = book
        self.fail_producer = fail_producer
        self.services = ServiceRegistry(heartbeat_timeout)  # the services that hold partitions for us
        self.lost_retention = lost_retention  # s a lost service stays listed (lostServiceRetention)
        self.replica_load: dict[str, int] = {}  # service id -> replicas placed there (spreads the next ones)

    async def register_service(self, service_id: str, host_id: str, tcp: str, unix: str, pid: int) -> dict:
        """A service that holds partitions for this coordinator says it is there (at start, and again
        whenever it lost us: a coordinator restart, a broken connection, being declared lost)."""
        known = service_id in self.services.services
        replaced = self.services.register(service_id, host_id, tcp, unix, pid)
        if not known or replaced:
            log.info("exchange service %s on host %s (%s) registered", service_id, host_id, tcp)
        self.save()
        if replaced:
            await self.services_lost(replaced)
        # what it holds for us: it frees the finished partitions of exchanges dropped, lost or aborted
        # while it could not be told (a restart, a failed release)
        held = [p.partition for ex in [*self.book.exchanges.values(), *self.book.previous.values()]
                for p in ex.producers.values() if p.location.get("service_id") == service_id
                or any(r["location"].get("service_id") == service_id and r["state"] != ReplicaState.LOST
                       for r in p.replicas)]
        return {"ok": True, "heartbeat_timeout": self.services.timeout, "partitions": held}

    async def service_heartbeat(self, service_id: str) -> dict:
        """``known`` false: the service must register (again)."""
        return {"known": self.services.heartbeat(service_id)}

    async def list_services(self) -> list[dict]:
        return self.services.describe()

    def registered_location(self, location: dict) -> dict:
        """A producer's location as the registry holds it: readers dial, and releases go to, only addresses a
        registered service (one that proved the operator's secret) gave, never ones a writer chose; a writer's
        other keys are dropped. Refused
        (``unregistered_service``) when it names no live registered service, or puts it at another address."""
        sid = location.get("service_id")
        record = self.services.services.get(sid) if isinstance(sid, str) else None
        if record is None:
            raise ServiceError(
                f"the producer's location names {sid!r}, which is not a registered exchange service of this "
                "coordinator: a partition must live in the coordinator's own service or in one that registered "
                "with it (`sparkflow-exchange serve --no-coordinator` with coordinator set, the Spark plugin's)",
                ErrorCode.UNREGISTERED_SERVICE)
        if record.state != ServiceState.ALIVE:
            raise ServiceError(f"the producer's location names {record.where()}, which was declared lost "
                               f"({record.lost_reason}); write the partition again", ErrorCode.UNREGISTERED_SERVICE)
        for key in ("tcp", "unix"):
            given = location.get(key)
            if given and given != getattr(record, key):
                raise ServiceError(
                    f"the producer's location puts exchange service {sid!r} at {key} address {given!r}, but it "
                    f"registered {getattr(record, key)!r}: a location is the service's own answer to ping",
                    ErrorCode.UNREGISTERED_SERVICE)
        # the registry's addresses, and whether the service speaks TLS: nothing else a writer puts in a location
        # (a spill directory, another service's keys) reaches readers
        return {**record.location(), "tls": location.get("tls") is True}

    def pick_replicas(self, location: dict | None, n: int) -> list[dict]:
        """Services on ``n`` hosts other than ``location``'s, one each, the least used first, for a partition's
        copies; ``location`` None: only check that the coordinator has live services on ``n`` + 1 hosts. Refused
        (``no_replica_host``) when it has too few: a copy on the partition's own host survives nothing."""
        alive = [r for r in self.services.services.values() if r.state == ServiceState.ALIVE]
        hosts = sorted({r.host_id for r in alive})
        own = location.get("host_id") if location is not None else None
        others: dict[str, ServiceRecord] = {}
        for r in sorted(alive, key=lambda r: (self.replica_load.get(r.service_id, 0), r.service_id)):
            if r.host_id != own and r.host_id not in others:
                others[r.host_id] = r
        enough = len(others) >= n if own is not None else len(hosts) >= n + 1
        if not enough:
            raise ServiceError(
                f"replicas={n} needs live exchange services on {n + 1} hosts (each partition's own and {n} other"
                f"{'s' if n > 1 else ''}), and this coordinator has them on {len(hosts)} host"
                f"{'s' if len(hosts) != 1 else ''} ({', '.join(hosts) or 'none'}"
                f"{'' if own is None else f'; the partition is on {own}'}): start `sparkflow-exchange serve "
                "--no-coordinator` on another host (docs/deployment.md), or write with replicas=0",
                ErrorCode.NO_REPLICA_HOST)
        if location is None:
            return []
        chosen = list(others.values())[:n]
        for r in chosen:
            self.replica_load[r.service_id] = self.replica_load.get(r.service_id, 0) + 1
        return [r.location() for r in chosen]

    async def check_services(self) -> None:
        """Declare lost the services whose heartbeats stopped, and their exchanges with them."""
        lost = self.services.expire()
        if lost:
            self.save()
            await self.services_lost(lost)
        self.forget_lost()

    def forget_lost(self) -> None:
        """Lost services are listed for lostServiceRetention, then forgotten: one line each."""
        forgotten = self.services.forget_lost(self.lost_retention)
        for record in forgotten:
            log.info("forgot %s, lost %.0f s ago (lostServiceRetention=%g s)", record.where(),
                     time.time() - record.lost_at, self.lost_retention)
        if forgotten:
            self.save()

    def save(self) -> None:
        """Keep the registry in the state directory, when there is one."""
        if self.book.journal is not None:
            self.book.journal.save_services(self.services.snapshot())

    async def services_lost(self, records: list[ServiceRecord], *, announce: bool = True) -> None:
        """An exchange with a committed partition on a lost service is lost (its data is incomplete for good);
        a running producer there failed (its task is retried elsewhere, or its write aborts). ``announce``:
        log each loss (once, when it happens; not again when a restarted coordinator takes them up)."""
        book = self.book
        by_id = {r.service_id: r for r in records}
        for record in records if announce else ():
            log.warning("%s is lost: %s", record.where(), record.lost_reason)
        for name, older in list(book.previous.items()):  # a version set aside with data there cannot come back
            if any(p.location.get("service_id") in by_id for p in older.producers.values()):
                book.release_previous(name, f"lost with a service that held it ({older.name!r} was being overwritten)")
                if name in book.exchanges:
                    book.persist(book.exchanges[name])
        for name, ex in list(book.exchanges.items()):
            self._replicas_lost(ex, by_id)
            held = [p for p in ex.producers.values() if p.location.get("service_id") in by_id]
            committed = set(ex.committed)
            gone = [p for p in held if p.partition in committed]
            if gone and not ex.stream:
                record = by_id[gone[0].location["service_id"]]
                takeover = after_loss({p.partition: [(r["state"], self._alive(r["location"])) for r in p.replicas]
                                       for p in gone})
                if takeover.event is Event.FAIL_OVER:
                    await self._fail_over(ex, gone, takeover.moves, record)
                    held = [p for p in held if p.location.get("service_id") in by_id]  # the rest: not committed
                else:
                    copies = " (and no complete replica of it on a live service)" if ex.replicas else ""
                    await book.end(name, Event.LOSE,
                                   f"exchange {name!r} was lost: {len(takeover.missing)} of its committed partitions "
                                   f"were held by {record.where()}, which was lost ({record.lost_reason}){copies}; "
                                   "the exchange's data went with it. Write the exchange again")
                    continue
            for p in held:
                if p.state != PartitionState.FAILED:
                    record = by_id[p.location["service_id"]]
                    await self.fail_producer(name, ex.epoch, p.partition, f"{record.where()} was lost: {record.lost_reason}")

    def _alive(self, location: dict) -> bool:
        record = self.services.services.get(location.get("service_id"))
        return record is not None and record.state == ServiceState.ALIVE

    def _replicas_lost(self, ex: Exchange, by_id: dict[str, ServiceRecord]) -> None:
        """Replicas on the lost services hold nothing any more: a committed partition reads on from its own
        service (under-replicated, which status and the metrics show); an uncommitted one cannot commit."""
        changed = False
        for p in ex.producers.values():
            lost = [r for r in p.replicas if r["location"].get("service_id") in by_id and r["state"] != ReplicaState.LOST]
            for r in lost:
                r["state"] = ReplicaState.LOST
                r["reason"] = f"{by_id[r['location']['service_id']].where()} was lost"
            if lost:
                ex.set_producer(p)
                changed = True
        if changed:
            self.book.persist(ex)

    async def _fail_over(self, ex: Exchange, gone: list[ProducerInfo], moves: dict[str, int],
                         record: ServiceRecord) -> None:
        """Each lost committed partition is read from its replica from now on (same partition id, same buffers
        in the same order): its location becomes the replica's, the lost one is listed as a lost replica."""
        t = ex.life.on(Event.FAIL_OVER, reason=f"{record.where()} was lost")
        changed = []
        for p in gone:
            replica = p.replicas.pop(moves[p.partition])
            p.replicas.append({"location": p.location, "state": ReplicaState.LOST,
                               "reason": f"{record.where()} was lost ({record.lost_reason})"})
            p.location = {**replica["location"], **self.services.services[replica["location"]["service_id"]].location()}
            p.spill = ""  # the spill file was the lost service's; the replica's service serves it
            p.failed_over += 1
            changed.append(ex.set_producer(p))
        log.warning("exchange %r: %d committed partitions held by %s are read from their replicas from now on",
                    ex.name, len(gone), record.where())
        for action in t.actions:
            if action is Action.PERSIST:
                self.book.persist(ex)
            elif action is Action.NOTIFY:
                await self.book.subscriptions.notify(ex, ex.name, changed=changed)
