"""Subpartitions and their views.

A subpartition is the sequence of buffers meant for one consumer (sequence
number = position). A view is one consumer's cursor over it: the server asks
a view whether its next item is an event or data, and takes items under
credit. ``PIPELINED_BOUNDED`` drops what it has sent (consume once);
``HYBRID`` and ``BLOCKING`` keep every buffer reachable (memory or spill file)
so a view may start again from any sequence number.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..buffer_kinds import BufferKind
from .buffer_pool import StoredBuffer
from .spill import FileSpan


class BufferOwner(Protocol):
    """What a subpartition asks of the result partition that holds its buffers (``ResultPartition``)."""

    consume_once: bool

    def release_ref(self, buf: StoredBuffer) -> None: ...

ERROR_KIND = 255  # internal: the partition failed; the server turns this into an ErrorResponse
# a spilled data buffer at least this large goes to a connection that sends from files as a FileSpan (left in its
# file); smaller ones, and events, are read: for a few KiB a read costs less than a descriptor of their own
SPAN_MIN = 64 * 1024


@dataclass(frozen=True)
class Item:
    kind: int
    flags: int
    payload: bytes | memoryview | FileSpan  # a FileSpan: spilled, left in its file for the connection to send
    shared: tuple[Any, StoredBuffer] | None = None  # (its ResultPartition, the buffer) pinned in an arena slot, sent by reference


class ConsumeOnceError(RuntimeError):
    pass


class Subpartition:
    def __init__(self, partition: BufferOwner, index: int) -> None:
        self.partition = partition
        self.index = index
        self.entries: deque[StoredBuffer] = deque()
        self.base = 0  # sequence number of entries[0] (PIPELINED_BOUNDED drops sent entries)
        self.data_count = 0  # data buffers ever added
        self.data_before: deque[int] = deque()  # per entry: data buffers before it
        self.streamed = 0  # highest position any view has taken (memory is released behind it)
        self.views: list[SubpartitionView] = []
        self.bytes_added = 0  # of data buffers
        self.end_counts: tuple[int, int] | None = None  # (data buffers, rows) at finish; rows -1 = not known

    @property
    def end(self) -> int:
        return self.base + len(self.entries)

    def append(self, buf: StoredBuffer) -> None:
        self.entries.append(buf)
        self.data_before.append(self.data_count)
        if buf.kind == BufferKind.DATA:
            self.data_count += 1
            self.bytes_added += buf.size
        for view in list(self.views):
            view.notify()

    def data_after(self, pos: int) -> int:
        """Data buffers at positions >= pos that exist now (the backlog)."""
        if pos >= self.end:
            return 0
        return self.data_count - self.data_before[pos - self.base]

    def entry(self, pos: int) -> StoredBuffer:
        return self.entries[pos - self.base]

    def create_view(self, resume_from: int, listener: Callable[[], None], *, resumed: bool = False) -> "SubpartitionView":
        """A cursor from ``resume_from``. ``resumed``: the position is one a reader reached before, so it must be
        held now (a buffer still stored, or the next one a running partition appends): a position beyond that, or
        behind what a consume-once partition dropped, is refused instead of waited for."""
        part = self.partition
        if resumed:
            self._check_resume(resume_from)
        if part.consume_once:
            if self.views or self.streamed > 0 and resume_from < self.streamed:
                raise ConsumeOnceError(
                    f"subpartition {self.index} of PIPELINED_BOUNDED partition {part.pid} was already consumed; "
                    "re-reading is impossible because its buffers are released as soon as they are sent "
                    "(use partitionType HYBRID or BLOCKING for re-readable exchanges)"
                )
            resume_from = max(resume_from, self.base)
        if resume_from < 0 or resume_from > self.end and part.finished:
            raise ValueError(f"resume sequence number {resume_from} is outside 0..{self.end} of subpartition {self.index}")
        view = SubpartitionView(self, resume_from, listener)
        self.views.append(view)
        return view

    def _check_resume(self, pos: int) -> None:
        part = self.partition
        if part.failure is not None:
            return  # the view's first item says why the partition failed
        last = self.end - 1 if part.finished else self.end  # a finished partition's last entry is its end event
        if pos < 0 or pos > last:
            state = "finished, its end event" if part.finished else "being written, the next buffer"
            raise ValueError(f"resume position {pos} is beyond subpartition {self.index} of partition {part.pid}: "
                             f"it holds buffers 0..{self.end - 1} ({state} is the last position to resume at)")
        if pos < self.base:
            raise ValueError(f"resume position {pos} of subpartition {self.index} of partition {part.pid} is gone: "
                             f"buffers before {self.base} were released once sent (consume once)")

    def on_taken(self, pos: int, buf: StoredBuffer) -> None:
        """A view took position pos: release memory that every target has now streamed."""
        if pos < self.streamed:
            return
        self.streamed = pos + 1
        self.partition.release_ref(buf)
        if self.partition.consume_once:
            while self.entries and self.base < self.streamed:
                self.entries.popleft()
                self.data_before.popleft()
                self.base += 1


class SubpartitionView:
    """One consumer's cursor; ``notify`` tells the server that something may be readable."""

    def __init__(self, sub: Subpartition, pos: int, listener: Callable[[], None]) -> None:
        self.sub = sub
        self.pos = pos
        self.listener = listener
        self.released = False
        self.shared = False  # the reader is on this host and copies buffers out of arena slots itself
        self.spans = False  # the connection sends spilled data buffers from their file (take yields FileSpans)

    def notify(self) -> None:
        if not self.released:
            self.listener()

    def _readable(self) -> bool:
        part = self.sub.partition
        if part.blocking and not part.finished:
            return False
        return self.pos < self.sub.end

    def next_is_event(self) -> bool | None:
        if self.released:
            return None
        if self.sub.partition.failure is not None or self.sub.partition.released:
            return True
        if not self._readable():
            return None
        return self.sub.entry(self.pos).kind != BufferKind.DATA

    def take(self) -> tuple[Item, int, int]:
        part = self.sub.partition
        if part.failure is not None or part.released:
            self.released = True
            message = part.failure if part.failure is not None else part.released_message()
            return Item(ERROR_KIND, 0, message.encode()), self.pos, 0
        pos = self.pos
        buf = self.sub.entry(pos)
        shared = None
        if self.shared and buf.arena is not None and buf.payload is not None:
            part.memory.pin(buf)  # the slot goes back to the writer only once the reader has copied it
            shared = (part, buf)
        if buf.payload is not None:
            payload = buf.payload
        elif self.spans and buf.kind == BufferKind.DATA and buf.size >= SPAN_MIN:
            payload = part.spilled_span(buf)
        else:
            payload = part.read_spilled(buf)
        if shared is None and buf.arena is not None and buf.payload is not None:
            # the bytes sit in the writer's arena slot, which is refilled once this buffer's memory is dropped
            # (maybe by this very take): a socket gets a copy, so no transport ever holds a view of the slot,
            # whether it copies on write (3.11) or keeps the caller's buffer (allowed from 3.12)
            payload = bytes(payload)
        self.pos += 1
        part.bytes_read += buf.size
        part.buffers_read += 1
        self.sub.on_taken(pos, buf)
        return Item(buf.kind, buf.flags, payload, shared), pos, self.sub.data_after(self.pos)

    def backlog(self) -> int:
        return self.sub.data_after(self.pos) if self._readable() else 0

    def release(self) -> None:
        self.released = True
        if self in self.sub.views:
            self.sub.views.remove(self)
