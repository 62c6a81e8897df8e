"""The coordinator's expiry: exchanges unused for ``ttl`` go, writes abandoned that long are aborted.

A stream's epochs are not expired here: an epoch lives as long as its stream retains it, and a stream
unused for ``ttl`` is dropped by its registry (``streams.py``).
"""
from __future__ import annotations

import time

from ..kinds import PartitionState
from .exchange_book import ExchangeBook
from .exchange_lifecycle import Event
from .exchanges import Exchange
from .writes import Writes


class Expiry:
    def __init__(self, book: ExchangeBook, writes: Writes, ttl: float = 3600.0) -> None:
        self.book = book
        self.writes = writes
        self.ttl = ttl

    async def expire(self, abandoned_writes: bool = False) -> None:
        """Drop exchanges unused for ``ttl`` seconds (nobody reading, no write open); abort writes left open
        that long with no producer running (their job died before its commit or abort: readers waiting for
        them learn so, and the exchange can expire). ``abandoned_writes``: an open write counts as unused
        too (no application that could finish it is alive)."""
        if self.ttl <= 0:
            return
        self._forget_lost_names()
        now = time.monotonic()
        for name, ex in list(self.book.exchanges.items()):
            if ex.stream or now - ex.last_used <= self.ttl:
                continue
            if ex.open_writes and not self._writing(ex):
                for write_id in sorted(ex.open_writes):
                    await self.writes.abort(name, ex.epoch, write_id,
                                            f"abandoned: neither committed nor aborted for ttl={self.ttl:g} s with no "
                                            "task writing (did the writing job end without committing?)")
                continue
            if (not ex.open_writes or abandoned_writes) and not self.book.subscriptions.watched(name):
                await self.book.end(name, Event.EXPIRE, f"expired (unused for ttl={self.ttl:g} s)")

    @staticmethod
    def _writing(ex: Exchange) -> bool:
        return any(p.state == PartitionState.RUNNING for p in ex.producers.values() if p.write_id in ex.open_writes)

    def _forget_lost_names(self) -> None:
        """A lost exchange's name is listed as lost for ``ttl``, then forgotten."""
        wall = time.time()
        expired = [n for n, v in self.book.lost.items() if wall - v.get("at", wall) > self.ttl]
        for name in expired:
            del self.book.lost[name]
        if expired:
            self.book.names_changed()
