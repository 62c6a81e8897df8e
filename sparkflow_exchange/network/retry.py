"""Asking again when a service had no room for a connection.

A service refuses a connection with code ``too_many_connections`` when a cap is full of handshakes in
progress, all its connections are taken, or it is out of file descriptors: each passes within moments
(a handshake takes one round trip). So clients ask again, after pauses growing from 50 ms to 1 s
(jittered, so a burst of clients does not come back at once), until ``budget`` seconds have passed;
then the last refusal is raised, saying how long it was tried. Any other error is raised at once.
"""
from __future__ import annotations

import random
import time
from typing import Awaitable, Callable, TypeVar

from ..errors import ErrorCode, ServiceError, error_for

T = TypeVar("T")
NO_ROOM = ErrorCode.TOO_MANY_CONNECTIONS
FIRST_PAUSE = 0.05
LONGEST_PAUSE = 1.0


def _pauses(budget: float):
    """The pauses before each new try, while ``budget`` seconds last (None: give up)."""
    deadline = time.monotonic() + budget
    pause = FIRST_PAUSE
    while True:
        left = deadline - time.monotonic()
        yield min(pause * random.uniform(0.5, 1.0), left) if left > 0 else None
        pause = min(pause * 2, LONGEST_PAUSE)


def _gave_up(exc: ServiceError, tries: int, budget: float) -> ServiceError:
    return error_for(exc.code, f"{exc} (refused {tries} times in {budget:g} s)")


def connect_retrying(connect: Callable[[], T], budget: float) -> T:
    """``connect()``, asked again while the service has no room, for up to ``budget`` seconds."""
    tries = 0
    for pause in _pauses(budget):
        tries += 1
        try:
            return connect()
        except ServiceError as exc:
            if exc.code != NO_ROOM:
                raise
            if pause is None:
                raise _gave_up(exc, tries, budget) from None
        time.sleep(pause)
    raise AssertionError("unreachable")


async def connect_retrying_async(connect: Callable[[], Awaitable[T]], budget: float) -> T:
    """The same, for a coroutine."""
    import asyncio  # here: the blocking clients that import this module never load asyncio

    tries = 0
    for pause in _pauses(budget):
        tries += 1
        try:
            return await connect()
        except ServiceError as exc:
            if exc.code != NO_ROOM:
                raise
            if pause is None:
                raise _gave_up(exc, tries, budget) from None
        await asyncio.sleep(pause)
    raise AssertionError("unreachable")
