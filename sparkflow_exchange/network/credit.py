"""Credit-based flow control on the sender side, sans-IO (Flink's PartitionRequestQueue).

Fed events (credit arrived, data available) and polled for what to send next;
the asyncio server only carries the result over its socket. The receiver's
half lives in ``consumer/buffer_manager.py``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from .protocol import ProtocolError


# ------------------------------------------------------------------ sender
class ViewFailed(Exception):
    """Taking the next item of one view raised (e.g. its spill file is gone): only that channel fails."""

    def __init__(self, receiver_id: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.receiver_id = receiver_id
        self.cause = cause


class ReadableView(Protocol):
    """What the sender queue needs of a subpartition view."""

    def next_is_event(self) -> bool | None:
        """True/False for the kind of the next item; None when nothing is available."""

    def take(self) -> tuple[Any, int, int]:
        """Remove the next item; returns (item, seq, backlog of data buffers after it)."""


@dataclass
class _Reader:
    view: ReadableView
    credit: int
    queued: bool = False
    sent_data: int = 0


class PartitionRequestQueue:
    """The readable views of one connection, in FIFO order.

    A view is *available* when its next item is an event, or data and its
    channel has credit. ``poll`` yields one item at a time and puts the view
    back at the tail, so one busy channel never starves the others, and a
    channel without credit never holds back those with credit.
    """

    def __init__(self) -> None:
        self._readers: dict[int, _Reader] = {}
        self._available: deque[int] = deque()

    def __contains__(self, receiver_id: int) -> bool:
        return receiver_id in self._readers

    def __len__(self) -> int:
        return len(self._readers)

    def credit_of(self, receiver_id: int) -> int:
        return self._readers[receiver_id].credit

    def add_view(self, receiver_id: int, view: ReadableView, initial_credit: int) -> None:
        if receiver_id in self._readers:
            raise ProtocolError(f"receiver id {receiver_id} is already in use on this connection")
        if initial_credit < 0:
            raise ProtocolError(f"negative initial credit {initial_credit}")
        self._readers[receiver_id] = _Reader(view, initial_credit)
        self.notify_available(receiver_id)

    def add_credit(self, receiver_id: int, credit: int) -> None:
        reader = self._readers.get(receiver_id)
        if reader is None:
            return  # credit for a cancelled request: harmless, as in Flink
        if credit <= 0:
            raise ProtocolError(f"AddCredit of {credit} for receiver {receiver_id}: credit must be positive")
        reader.credit += credit
        self.notify_available(receiver_id)

    def notify_available(self, receiver_id: int) -> None:
        reader = self._readers.get(receiver_id)
        if reader is not None and not reader.queued and self._is_available(reader):
            reader.queued = True
            self._available.append(receiver_id)

    def remove(self, receiver_id: int) -> ReadableView | None:
        reader = self._readers.pop(receiver_id, None)
        return reader.view if reader else None

    def views(self) -> dict[int, ReadableView]:
        return {rid: r.view for rid, r in self._readers.items()}

    @staticmethod
    def _is_available(reader: _Reader) -> bool:
        is_event = reader.view.next_is_event()
        return is_event is True or (is_event is False and reader.credit > 0)

    def poll(self) -> tuple[int, Any, int, int] | None:
        """Next (receiver id, item, seq, backlog) to write, or None when nothing may be sent.

        Raises :class:`ViewFailed` (naming the receiver) when a view cannot produce its next item."""
        while self._available:
            rid = self._available.popleft()
            reader = self._readers.get(rid)
            if reader is None:
                continue
            reader.queued = False
            try:
                if not self._is_available(reader):
                    continue
                is_event = reader.view.next_is_event()
                item, seq, backlog = reader.view.take()
            except Exception as exc:  # noqa: BLE001 - the caller fails this channel, the others go on
                raise ViewFailed(rid, exc) from exc
            if not is_event:
                reader.credit -= 1
                reader.sent_data += 1
            self.notify_available(rid)
            return rid, item, seq, backlog
        return None
