"""Who listens to which exchange, and the one condition every waiting read or writer wakes on.

Readers subscribe to an exchange and get its full state, then a delta each time it changes; a read
that waits for an exchange to be declared or sealed, a stream's reader waiting for the next epoch and
a stream's writer waiting for room all wait on one condition, notified after every change. Runs on the
service's event loop, so no locks.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from ..kinds import ExchangeState

if TYPE_CHECKING:
    from .exchanges import Exchange

Callback = Callable[[dict], None]


class Subscriptions:
    def __init__(self) -> None:
        self._subscribers: dict[str, set[Callback]] = {}
        self._changed = asyncio.Condition()

    def add(self, name: str, callback: Callback) -> Callable[[], None]:
        """Subscribe ``callback`` to exchange ``name``; returns the function that unsubscribes it."""
        self._subscribers.setdefault(name, set()).add(callback)

        def unsubscribe() -> None:
            subs = self._subscribers.get(name)
            if subs is not None:
                subs.discard(callback)
                if not subs:
                    del self._subscribers[name]
        return unsubscribe

    def watched(self, name: str) -> bool:
        """Somebody reads ``name`` (it does not expire meanwhile)."""
        return bool(self._subscribers.get(name))

    async def notify(self, ex: Exchange | None, name: str, changed: list[dict] = (), **extra: Any) -> None:
        """Tell subscribers what changed (a delta after the full state they got at subscribe; ``ex`` None: the
        name is gone), then wake every waiter."""
        subscribers = self._subscribers.get(name)
        if subscribers:
            body = {**ex.header(), "producers": list(changed), **extra} if ex is not None \
                else {"name": name, "state": ExchangeState.DROPPED, **extra}
            for callback in list(subscribers):
                callback(body)
        await self.wake()

    async def wake(self) -> None:
        """Wake every waiter: something changed that a predicate may be waiting for."""
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``predicate`` to hold (checked after each change); whether it did."""
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(predicate), timeout)
        except asyncio.TimeoutError:
            return False
        return True
