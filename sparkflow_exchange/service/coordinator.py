"""The coordinator role: exchanges, their producers and their lifecycle.

Flink's JobManager partition tracking, reduced to what a Spark write needs. The coordinator is its
roles over one book of exchanges (``exchange_book.py``): writes (``writes.py``: declare, register,
commit, abort, drop), reads (``reads.py``: describe, wait, subscribe), the services that hold
partitions for it (``service_roster.py``), expiry (``expiry.py``) and the state directory
(``recovery.py``, ``journal.py``). Which event is legal in which state of an exchange is one table
(``exchange_lifecycle.py``). All of it runs on the service's event loop, so no locks.
"""
from __future__ import annotations

from typing import Callable

from .exchange_book import ExchangeBook, Release, StreamIndex
from .expiry import Expiry
from .journal import Journal
from .reads import Reads
from .recovery import restore
from .registry import ServiceRegistry
from .service_roster import ServiceRoster
from .subscriptions import Subscriptions
from .writes import PartitionOwner, Writes


class Coordinator:
    """The roles, wired; its methods are the coordinator's RPCs and what the service's housekeeping calls."""

    def __init__(self, release: Release, ttl: float = 3600.0, heartbeat_timeout: float = 10.0,
                 partition_owner: PartitionOwner = lambda location, pid: None, max_exchanges_per_owner: int = 0,
                 lost_retention: float = 600.0) -> None:
        """``release``: frees partitions (location, partition id, the credential that joined it), with why;
        ``max_exchanges_per_owner``: exchanges and streams one application credential may own at once
        (maxExchangesPerCredential; 0: no cap; the operator has none)."""
        self.subscriptions = Subscriptions()
        self.book = ExchangeBook(release, self.subscriptions, max_exchanges_per_owner)
        self.writes = Writes(self.book, lambda location: self.roster.registered_location(location), partition_owner,
                             lambda location, n: self.roster.pick_replicas(location, n))
        self.roster = ServiceRoster(self.book, self.writes.producer_failed, heartbeat_timeout, lost_retention)
        self.reads = Reads(self.book)
        self.expiry = Expiry(self.book, self.writes, ttl)
        # the RPCs and housekeeping, each answered by its role
        self.declare, self.register_producer = self.writes.declare, self.writes.register_producer
        self.producer_finished, self.producer_failed = self.writes.producer_finished, self.writes.producer_failed
        self.commit, self.abort, self.drop = self.writes.commit, self.writes.abort, self.writes.drop
        self.get_exchange, self.subscribe, self.list = self.reads.get_exchange, self.reads.subscribe, self.reads.list
        self.register_service, self.service_heartbeat = self.roster.register_service, self.roster.service_heartbeat
        self.list_services, self.check_services = self.roster.list_services, self.roster.check_services
        self.services_lost, self.registered_location = self.roster.services_lost, self.roster.registered_location
        self.expire = self.expiry.expire

    @property
    def exchanges(self) -> dict:
        """name -> the exchange (a batch exchange, or a stream's epoch ``<stream>#<epoch>``)."""
        return self.book.exchanges

    @property
    def lost(self) -> dict[str, dict]:
        """name -> how it was lost: exchanges whose data went with a service that died."""
        return self.book.lost

    @lost.setter
    def lost(self, lost: dict[str, dict]) -> None:
        """The lost names a predecessor left (a state file's ledger takes them over at start)."""
        self.book.lost = lost

    @property
    def services(self) -> ServiceRegistry:
        """The services that hold partitions for this coordinator (registry.py)."""
        return self.roster.services

    @property
    def ttl(self) -> float:
        return self.expiry.ttl

    def attach_streams(self, streams: StreamIndex) -> None:
        """The stream registry beside the exchanges: a name is a stream's or an exchange's, and a credential's
        streams count against its exchanges."""
        self.book.streams = streams

    def watch_names(self, callback: Callable[[list[str], dict[str, dict]], None]) -> None:
        """Call ``callback(names, lost)`` whenever the set of names changes (the ledger, ``ledger.py``)."""
        self.book.on_names_changed = callback

    async def restore(self, journal: Journal) -> int:
        """Take up the state a previous coordinator left in ``journal``; from now on keep it there."""
        return await restore(self.book, self.roster, self.writes, journal)
