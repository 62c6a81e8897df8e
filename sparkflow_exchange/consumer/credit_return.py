"""When the credit of buffers a read finished with goes back to their senders: a plain object, no IO, no threads.

A read's task thread takes buffers from a queue and finishes each when it takes the next; the IO thread owns the
channels and sends AddCredit. Waking the IO thread for every finished buffer costs the reader more than the buffer
does, so the task thread only notes each finished buffer's channel here, and the IO thread returns their credit
in batches as buffers arrive (one AddCredit per channel for many buffers).

Two cases need the task thread to ask instead:

- a channel whose sender has no credit left (it sent its whole window) sends nothing more, so no arrival carries its
  credit back: once a batch is noted and such a channel exists, the task thread asks for a batch;
- before the task thread waits for the next buffer it asks for everything noted. A batch can hold only other
  channels' buffers and leave a silent sender's credit here, with the reader waiting for that sender: nothing else
  would return it.

The invariant tests check: once the task thread asked before waiting and the IO thread did what it was asked,
nothing noted is left. The deque's append and popleft are atomic, so the two threads share one without a lock.
"""
from __future__ import annotations

import enum
from collections import deque
from typing import Generic, Hashable, TypeVar

Channel = TypeVar("Channel", bound=Hashable)


class CreditAsk(enum.Enum):
    """What the task thread asks the IO thread to return."""

    BATCH = "batch"  # the oldest ``batch`` noted buffers
    ALL = "all"  # every noted buffer: the task thread is about to wait


class CreditReturn(Generic[Channel]):
    """The hand-off of finished buffers' credit between a read's task thread and its IO thread."""

    def __init__(self, batch: int) -> None:
        if batch < 1:
            raise ValueError(f"a credit batch holds at least one buffer, not {batch}")
        self.batch = batch
        self._finished: deque[Channel] = deque()  # channels of finished buffers, oldest first
        self._silent: set[Channel] = set()  # channels whose sender holds no credit and so sends nothing
        self._asked = False  # a BATCH ask is on its way to the IO thread

    @classmethod
    def for_window(cls, exclusive: int, floating: int) -> "CreditReturn[Channel]":
        """The hand-off for channels of ``exclusive`` buffers each and a gate of ``floating`` more: a batch is half the
        most credit a channel can hold, at least 1, so its sender keeps half its window; each batch wakes the IO
        thread and sends an AddCredit (a reader that would wait returns what it has at once)."""
        return cls(max(1, (exclusive + floating) // 2))

    # ------------------------------------------------------------ task thread
    def finished(self, channel: Channel) -> CreditAsk | None:
        """The task thread finished a buffer of ``channel``; returns what to ask the IO thread for, if anything."""
        self._finished.append(channel)
        if self._silent and len(self._finished) >= self.batch and not self._asked:
            self._asked = True
            return CreditAsk.BATCH
        return None

    def before_wait(self) -> CreditAsk | None:
        """The task thread found no buffer ready and will wait; returns ALL if any credit is still noted."""
        if self._finished:
            self._asked = True
            return CreditAsk.ALL
        return None

    # ------------------------------------------------------------ IO thread
    def arrived(self, channel: Channel, sender_credit: int) -> dict[Channel, int]:
        """A data buffer of ``channel`` arrived (after it was queued for the task thread), its sender now holding
        ``sender_credit``; returns the credit to send now, per channel (a batch, when one is noted)."""
        if sender_credit <= 0:  # marked before the noted buffers are looked at: the task thread's next
            self._silent.add(channel)  # finished() sees it
        if self._finished and (self._silent or len(self._finished) >= self.batch):
            return self.take(CreditAsk.BATCH)
        return {}

    def take(self, ask: CreditAsk) -> dict[Channel, int]:
        """Do what the task thread asked: the noted buffers to return as credit now, per channel."""
        self._asked = False
        finished = self._finished
        n = len(finished) if ask is CreditAsk.ALL else min(self.batch, len(finished))
        returned: dict[Channel, int] = {}
        for _ in range(n):
            channel = finished.popleft()
            returned[channel] = returned.get(channel, 0) + 1
        return returned

    def credit_sent(self, channel: Channel) -> None:
        """``channel``'s sender got credit again (or the channel ended): it is no longer silent."""
        self._silent.discard(channel)

    def __len__(self) -> int:
        """Finished buffers whose credit is still noted here."""
        return len(self._finished)
