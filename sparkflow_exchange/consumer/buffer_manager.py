"""Credit-based flow control on the receiver side, sans-IO (Flink's BufferManager).

Each input channel owns ``buffersPerChannel`` exclusive buffers; the gate
owns ``floatingBuffersPerGate`` floating ones, lent to channels whose sender
reports a backlog larger than their credit. Methods take events (a buffer
arrived, the reader consumed one) and return the credit announcements to send.
"""
from __future__ import annotations

from collections import deque

from ..buffer_kinds import BufferKind
from ..network.protocol import ProtocolError


class FloatingBufferPool:
    """A gate's floating buffers, lent to the channels whose backlog exceeds their credit."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self._waiting: deque[ChannelCredit] = deque()

    def request(self, channel: "ChannelCredit", wanted: int) -> int:
        granted = min(wanted, self.free)
        self.free -= granted
        if granted < wanted and channel not in self._waiting:
            self._waiting.append(channel)
        return granted

    def recycle(self) -> list[tuple["ChannelCredit", int]]:
        """A floating buffer came back: lend it to a channel still short of buffers."""
        self.free += 1
        while self._waiting and self.free:
            channel = self._waiting[0]
            if channel.closed or channel.wanted_floating() <= 0:
                self._waiting.popleft()
                continue
            self.free -= 1
            channel.floating += 1
            channel.announced += 1
            if channel.wanted_floating() <= 0:
                self._waiting.popleft()
            return [(channel, 1)]
        return []

    def forget(self, channel: "ChannelCredit") -> None:
        if channel in self._waiting:
            self._waiting.remove(channel)


class ChannelCredit:
    """One input channel's buffers: ``exclusive`` of its own plus floating ones on loan.

    Invariant: ``announced + in_use == exclusive + floating`` — every buffer the
    channel holds is either empty and announced to the sender as credit, or
    holds a received buffer the reader has not consumed yet.
    """

    def __init__(self, exclusive: int, pool: FloatingBufferPool, receiver_id: int = 0) -> None:
        if exclusive < 1:
            raise ValueError("a channel needs at least one exclusive buffer")
        self.receiver_id = receiver_id
        self.exclusive = exclusive
        self.pool = pool
        self.floating = 0
        self.announced = exclusive  # the initial credit of the partition request
        self.in_use = 0
        self.backlog = 0
        self.closed = False

    def initial_credit(self) -> int:
        return self.exclusive

    def wanted_floating(self) -> int:
        return self.backlog - self.announced

    def on_buffer(self, kind: int, backlog: int) -> list[tuple["ChannelCredit", int]]:
        """A buffer arrived; returns credit announcements (channel, n) to send."""
        if kind != BufferKind.DATA:
            return []  # events travel without credit
        if self.announced <= 0:
            raise ProtocolError(f"receiver {self.receiver_id} got a data buffer without credit")
        self.announced -= 1
        self.in_use += 1
        self.backlog = backlog
        wanted = self.wanted_floating()
        if wanted > 0:
            got = self.pool.request(self, wanted)
            if got:
                self.floating += got
                self.announced += got
                return [(self, got)]
        return []

    def on_consumed(self) -> list[tuple["ChannelCredit", int]]:
        """The reader is done with one data buffer: it becomes credit again, here or elsewhere."""
        if self.in_use <= 0:
            raise ValueError("consumed more buffers than were received")
        self.in_use -= 1
        if self.closed:
            return self._give_back_one()
        if self.floating and self.announced >= self.backlog:
            return self._give_back_one()
        self.announced += 1
        return [(self, 1)]

    def _give_back_one(self) -> list[tuple["ChannelCredit", int]]:
        if self.floating:
            self.floating -= 1
            return [(c, n) for c, n in self.pool.recycle() if not c.closed]
        return []

    def close(self) -> list[tuple["ChannelCredit", int]]:
        """Channel finished: hand every idle floating buffer back to the gate."""
        self.closed = True
        self.pool.forget(self)
        actions: list[tuple[ChannelCredit, int]] = []
        idle_floating = min(self.floating, self.announced)
        for _ in range(idle_floating):
            self.announced -= 1
            actions.extend(self._give_back_one())
        return actions
