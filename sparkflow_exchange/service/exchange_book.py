"""The coordinator's book: every exchange it knows by name, the versions overwrites set aside, the names lost.

Each role of the coordinator (writes, reads, the service registry, expiry, the state directory) works
on one book: finding an exchange by name and version, keeping its record in the state directory,
releasing its producers' partitions, and ending it (drop, expiry, loss) as its lifecycle says.
"""
from __future__ import annotations

import itertools
import time
from typing import Callable, Protocol

from ..errors import ErrorCode, ServiceError
from .exchange_lifecycle import Action, Event, ReplicaState
from .exchanges import Exchange, ProducerInfo
from .journal import Journal
from .subscriptions import Subscriptions

# (location, partition id, the credential that joined it)s, why, and the code its writer is told ("replaced": a
# drop, overwrite or expiry)
Release = Callable[[list[tuple[dict, str, str]], str, str], None]
REPLACED = ErrorCode.REPLACED  # the exchange went (dropped, overwritten, expired): its writers fail with ExchangeReplaced
RELEASED = ErrorCode.RELEASED  # one write or attempt went (lost the commit, aborted); the exchange stays


class StreamIndex(Protocol):
    """What the coordinator asks of the streams beside its exchanges (service/streams.py)."""

    def is_stream(self, name: str) -> bool:
        """A stream of that name exists."""

    def owned_by(self, owner: str) -> int:
        """Streams the credential owns."""


class NoStreams:
    def is_stream(self, name: str) -> bool:
        return False

    def owned_by(self, owner: str) -> int:
        return 0


class ExchangeBook:
    def __init__(self, release: Release, subscriptions: Subscriptions, max_exchanges_per_owner: int = 0) -> None:
        self.exchanges: dict[str, Exchange] = {}
        # name -> the committed version an open overwrite replaces: released when the overwrite commits,
        # the name's version again when it aborts (a failed write changes nothing)
        self.previous: dict[str, Exchange] = {}
        # name -> {"message", "at", "owner"}: exchanges whose data went with a service that died (ledger.py)
        self.lost: dict[str, dict] = {}
        self.release = release  # called with (location, partition id) of partitions to free, and why
        self.subscriptions = subscriptions
        self.max_exchanges_per_owner = max_exchanges_per_owner
        self.streams: StreamIndex = NoStreams()
        self.journal: Journal | None = None  # the state directory, when it has one (recovery.py)
        self.on_names_changed: Callable[[list[str], dict[str, dict]], None] | None = None
        self.epochs = itertools.count(1)
        self.writes = itertools.count(1)

    def names_changed(self) -> None:
        if self.journal is not None:
            self.journal.save_lost(self.lost)
        if self.on_names_changed is not None:
            self.on_names_changed(sorted(self.exchanges), dict(self.lost))

    def persist(self, ex: Exchange) -> None:
        """Write the exchange to the state directory (a state reads may see: declared, sealed, aborted)."""
        if self.journal is not None and not ex.stream and self.exchanges.get(ex.name) is ex:
            record = ex.record()
            older = self.previous.get(ex.name)
            if older is not None:  # an open overwrite: a restart that aborts it gives the name this version again
                record["previous"] = older.record()
            self.journal.save_exchange(ex.name, record)

    def get(self, name: str, epoch: int | None = None) -> Exchange:
        """The exchange (of version ``epoch``, when a write or read of it is running), marked used now."""
        ex = self.exchanges.get(name)
        if ex is None and epoch is not None:  # a write or read of it is running: it was there
            raise ServiceError(f"exchange {name!r} was dropped (or expired) while this write or read was running",
                               ErrorCode.REPLACED)
        if ex is None:
            raise ServiceError(f"exchange {name!r} does not exist", ErrorCode.NO_EXCHANGE)
        if epoch is not None and ex.epoch != epoch:
            raise ServiceError(
                f"exchange {name!r} was replaced (overwrite or drop) while this write or read was running",
                ErrorCode.REPLACED)
        ex.last_used = time.monotonic()
        return ex

    def release_producers(self, producers: list[ProducerInfo], reason: str, code: ErrorCode = RELEASED) -> None:
        """Free the producers' partitions; their connected readers and running writers get ``reason`` at once."""
        if producers:
            # a partition's replicas (same id, other services) go with it
            self.release([(where, p.partition, p.owner) for p in producers
                          for where in [p.location, *(r["location"] for r in p.replicas
                                                      if r.get("state") != ReplicaState.LOST)]], reason, code)

    def release_previous(self, name: str, reason: str) -> None:
        """The version an overwrite set aside goes: the overwrite committed, or the name was dropped or lost."""
        older = self.previous.pop(name, None)
        if older is not None:
            older.life.on(Event.RELEASE, reason=reason)
            self.release_producers(list(older.producers.values()), reason, REPLACED)

    def check_room(self, owner: str, name: str, what: str = "exchange") -> None:
        """Refuse a new exchange or stream of ``owner`` that owns as many as one credential may."""
        from ..network.auth import OPERATOR

        if not owner or owner == OPERATOR or not self.max_exchanges_per_owner:
            return
        owned = sum(1 for ex in self.exchanges.values() if ex.owner == owner and not ex.stream) + \
            self.streams.owned_by(owner)
        if owned >= self.max_exchanges_per_owner:
            raise ServiceError(f"declaring {what} {name!r} is refused: credential {owner!r} owns {owned} exchanges and "
                               f"streams, and one application credential may own at most maxExchangesPerCredential="
                               f"{self.max_exchanges_per_owner}; drop one it no longer needs", ErrorCode.LIMIT)

    async def end(self, name: str, event: Event, reason: str) -> dict:
        """Drop, expire or lose the exchange ``name`` as its lifecycle says: its record and partitions go,
        its readers are told. A name only lost is forgotten."""
        ex = self.exchanges.get(name)
        if ex is None:
            if event is Event.RELEASE and self.lost.pop(name, None) is not None:
                self.names_changed()
                return {"dropped": name, "partitions": 0}
            raise ServiceError(f"exchange {name!r} does not exist", ErrorCode.NO_EXCHANGE)
        t = ex.life.on(event, reason=reason)
        del self.exchanges[name]
        if event is Event.LOSE:
            self.lost[name] = {"at": time.time(), "message": reason, "owner": ex.owner}
        for action in t.actions:
            if action is Action.FORGET:
                if self.journal is not None:
                    self.journal.remove_exchange(name)
                self.names_changed()
            elif action is Action.RELEASE_ALL:
                self.release_producers(list(ex.producers.values()), reason, REPLACED)
            elif action is Action.RELEASE_PREVIOUS:
                self.release_previous(name, reason)
            elif action is Action.NOTIFY:
                await self.subscriptions.notify(None, name, **({"reason": reason} if event is Event.LOSE else {}))
        return {"dropped": name, "partitions": len(ex.producers)}
