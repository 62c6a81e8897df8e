"""A view over a range of subpartitions of a finished partition: one channel per producer for a coalesced read.

A coalesced read partition reads subpartitions ``[start, end)`` of every
producer. One channel per (producer, subpartition) would be 40,000 channels at
200 x 200; instead the reader asks each producer's service once for the range,
and the service walks one :class:`SubpartitionView` after another. Sequence
numbers run across the range (each inner end-of-partition is skipped, one
closes the range and carries the range's summed buffer and row counts), so a
resumed request names a position across the range.
Ranges are served for finished partitions only (coalescing is planned for
sealed exchanges), so every subpartition's length is fixed.
"""
from __future__ import annotations

import dataclasses
from bisect import bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, Callable

from ..buffer_kinds import END_COUNTS, BufferKind
from .subpartition import ERROR_KIND, ConsumeOnceError, Item, Subpartition, SubpartitionView

if TYPE_CHECKING:
    from .result_partition import ResultPartition


class SubpartitionRangeError(ValueError):
    """A range request the partition cannot serve (empty, out of bounds, or the partition is still written)."""


class RangeView:
    """Subpartitions ``start..end-1`` of one partition, in order, as one sequence (the server's ReadableView)."""

    def __init__(self, part: "ResultPartition", start: int, end: int, resume_from: int,
                 listener: Callable[[], None]) -> None:
        n = part.num_subpartitions
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= n):
            raise SubpartitionRangeError(
                f"subpartition range [{start}, {end}) of partition {part.pid} is empty or outside its "
                f"{n} subpartitions (needs 0 <= start < end <= {n})")
        if part.released:
            raise RuntimeError(f"partition {part.pid} was released")
        if not part.finished:
            raise SubpartitionRangeError(
                f"a range of subpartitions is served for finished partitions only, and partition {part.pid} is still "
                "being written (coalesced reads are planned for sealed exchanges)")
        self.part = part
        self.listener = listener
        self._subs: list[Subpartition] = part.subpartitions[start:end]
        if part.consume_once and any(s.views or s.streamed > 0 for s in self._subs):
            raise ConsumeOnceError(
                f"subpartitions [{start}, {end}) of PIPELINED_BOUNDED partition {part.pid} were already (partly) "
                "consumed; re-reading is impossible because its buffers are released as soon as they are sent "
                "(use partitionType HYBRID or BLOCKING for re-readable exchanges)")
        # positions of each subpartition before its end-of-partition (which is its last entry)
        lengths = [s.end - 1 for s in self._subs]
        self._first = [0, *accumulate(lengths)]  # global position of each subpartition's first item
        self.total = self._first[-1]  # position of the closing end-of-partition
        data = [s.data_after(s.base) for s in self._subs]
        self._data_later = [sum(data[k + 1:]) for k in range(len(data))]  # data buffers after subpartition k
        ends = [s.end_counts or (s.data_count, -1) for s in self._subs]
        rows = [r for _, r in ends]
        self._end = END_COUNTS.pack(sum(b for b, _ in ends), -1 if min(rows) < 0 else sum(rows))
        if not 0 <= resume_from <= self.total:
            raise SubpartitionRangeError(
                f"resume position {resume_from} is outside 0..{self.total} of subpartitions [{start}, {end}) "
                f"of partition {part.pid}")
        self.pos = resume_from
        self.released = False
        self._shared = False
        self._spans = False
        k = min(bisect_right(self._first, resume_from) - 1, len(self._subs) - 1)
        self._k = k
        self._inner: SubpartitionView = self._subs[k].create_view(resume_from - self._first[k], listener)

    # ------------------------------------------------------------ what the server reads
    @property
    def sub(self) -> Subpartition:
        """The subpartition being read now (for status)."""
        return self._inner.sub

    @property
    def shared(self) -> bool:
        return self._shared

    @shared.setter
    def shared(self, value: bool) -> None:
        self._shared = value
        self._inner.shared = value

    @property
    def spans(self) -> bool:
        return self._spans

    @spans.setter
    def spans(self, value: bool) -> None:
        self._spans = value
        self._inner.spans = value

    def _advance(self) -> None:
        """Past an inner end-of-partition that is not the last: on to the next subpartition."""
        if self.part.released or self.part.failure is not None:
            return  # the inner view yields the error
        while self._k < len(self._subs) - 1 and self._inner.pos >= self._inner.sub.end - 1:
            self._inner.release()
            self._k += 1
            self._inner = self._subs[self._k].create_view(0, self.listener)
            self._inner.shared = self._shared
            self._inner.spans = self._spans

    def next_is_event(self) -> bool | None:
        if self.released:
            return None
        self._advance()
        return self._inner.next_is_event()

    def take(self) -> tuple[Item, int, int]:
        self._advance()
        item, _, _ = self._inner.take()
        if item.kind == ERROR_KIND:
            self.released = True
            return item, self.pos, 0
        if item.kind == BufferKind.END_OF_PARTITION:  # the closing one: the counts of the whole range
            item = dataclasses.replace(item, payload=self._end)
        seq = self.pos
        self.pos += 1
        return item, seq, self.backlog()

    def backlog(self) -> int:
        if self.released:
            return 0
        return self._inner.backlog() + self._data_later[self._k]

    def notify(self) -> None:
        if not self.released:
            self.listener()

    def release(self) -> None:
        self.released = True
        self._inner.release()
