"""The coordinator's reader role: describe an exchange to a reader, wait for it, subscribe to its changes.

A reader asks for an exchange's description (waiting, up to what it asks, for the exchange to be
declared, or sealed), then subscribes to it: it gets the full state, then each change, until the
producer set is sealed. The description carries the lifecycle's verdict (``readable``): whether the
exchange may be read, and if not, why, which every reader (Python or JVM) follows.
"""
from __future__ import annotations

from typing import Callable

from ..errors import ErrorCode, ServiceError
from ..kinds import ExchangeState
from .exchange_book import ExchangeBook


class Reads:
    def __init__(self, book: ExchangeBook) -> None:
        self.book = book

    def _not_a_batch(self, name: str) -> ServiceError:
        return ServiceError(f"exchange {name!r} is a stream written by a streaming query: read it with "
                            "spark.readStream.format('pipelined')", ErrorCode.NOT_A_BATCH)

    async def get_exchange(self, name: str, wait: float = 0.0, need_subpartitions: bool = False,
                           until_sealed: bool = False) -> dict:
        """The exchange's description, waiting up to ``wait`` s for it to be declared; ``until_sealed``: for an
        exchange that is declared, up to ``wait`` s for it to be sealed or aborted instead (a reader that reads
        committed exchanges only waits here, woken by the commit, rather than asking again and again)."""
        book = self.book
        if name in book.lost and name not in book.exchanges:
            raise ServiceError(book.lost[name]["message"], ErrorCode.EXCHANGE_LOST)
        if book.streams.is_stream(name):
            raise self._not_a_batch(name)

        def declared() -> bool:
            ex = book.exchanges.get(name)
            if ex is None and book.streams.is_stream(name):
                return True
            return ex is not None and (not need_subpartitions or ex.num_subpartitions is not None
                                       or ex.state == ExchangeState.ABORTED)

        def ready() -> bool:
            ex = book.exchanges.get(name)
            if until_sealed:  # gone (dropped) or not declared: answered at once, as without a wait
                return ex is None or ex.sealed or ex.state == ExchangeState.ABORTED
            return declared()

        if not ready() and wait > 0:
            await book.subscriptions.wait_for(ready, wait)
        ex = book.exchanges.get(name)
        if ex is None and book.streams.is_stream(name):
            raise self._not_a_batch(name)
        if ex is None:
            raise ServiceError(
                f"exchange {name!r} does not exist (waited {wait:g} s for a writer to declare it; "
                "check the name, or raise declareTimeout)", ErrorCode.NO_EXCHANGE)
        if not declared():
            raise self._no_width(ex.name, ex.coalesce, wait)
        return book.get(name).describe()

    @staticmethod
    def _no_width(name: str, coalesce: bool, wait: float) -> ServiceError:
        if coalesce:
            return ServiceError(
                f"exchange {name!r} does not know its number of subpartitions yet: without numSubpartitions the "
                "first write task fixes it (spark.sql.shuffle.partitions of the writing session), and none "
                f"registered within {wait:g} s (declareTimeout); start the write, or set numSubpartitions",
                ErrorCode.NO_SUBPARTITIONS)
        return ServiceError(
            f"exchange {name!r} does not know its number of subpartitions yet (a forward/broadcast write "
            "without numSubpartitions fixes it at commit); set numSubpartitions on the writer to read while it writes",
            ErrorCode.NO_SUBPARTITIONS)

    def subscribe(self, name: str, callback: Callable[[dict], None], seal: int | None = None) -> Callable[[], None]:
        """The callback gets the full state now, then deltas (``producers`` changed, ``removed``, ``committed``).

        ``seal``: the reader was planned after that many seals (its description's ``seals``) and reads the
        next one; once that seal happened, the full state says which producers it holds (``read_state``)."""
        ex = self.book.get(name)
        unsubscribe = self.book.subscriptions.add(name, callback)
        full = {**ex.describe(), "full": True}
        state = ex.read_state(seal) if isinstance(seal, int) and not isinstance(seal, bool) else None
        if state is not None:
            full["read_state"] = state
        callback(full)
        return unsubscribe

    def list(self) -> list[dict]:
        """Batch exchanges (a stream's epochs are listed with their stream)."""
        return [ex.describe() for ex in self.book.exchanges.values() if not ex.stream]
