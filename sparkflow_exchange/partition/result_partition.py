"""A result partition: one Spark write-task attempt's output, split into subpartitions.

The three partition types differ only in where a buffer lives and when it
may be read (DESIGN.md section 3):

* ``PIPELINED_BOUNDED``: memory only; a slot is freed when its buffer has been
  sent to every target, so a slow consumer stops the writer (credit = free slots).
* ``BLOCKING``: every buffer goes to the spill file at once; readable after finish.
* ``HYBRID``: every buffer is written through to the spill file and kept in
  memory for the pipelined consumer; memory is dropped once streamed, or the
  oldest buffers are dropped when the pool is full. Disk keeps it re-readable.
"""
from __future__ import annotations

import time
import uuid
from collections import deque
from pathlib import Path
from typing import Callable

from ..network.protocol import BROADCAST, BufferKind
from .buffer_pool import BufferPool, MemoryBudget, StoredBuffer
from .spill import SpillFile
from .subpartition import Subpartition, SubpartitionView


class PartitionStateError(RuntimeError):
    pass


def _spill_name(pid: str) -> str:
    """A file name for any partition id: safe characters, bounded length, unique per registration."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in pid)[:80]
    return f"{safe}-{uuid.uuid4().hex[:6]}.data"


class ResultPartition:
    def __init__(
        self,
        pid: str,
        num_subpartitions: int,
        partition_type: str,
        budget: MemoryBudget,
        slots: int,
        buffer_size: int,
        spill_dir: Path,
        exchange: str = "",
        attempt: str = "",
    ) -> None:
        if num_subpartitions < 1:
            raise ValueError(f"a partition needs at least one subpartition, got {num_subpartitions}")
        self.pid = pid
        self.exchange = exchange
        self.attempt = attempt
        self.partition_type = partition_type
        self.consume_once = partition_type == "PIPELINED_BOUNDED"
        self.blocking = partition_type == "BLOCKING"
        self.num_subpartitions = num_subpartitions
        self.pool = None if self.blocking else BufferPool(budget, slots, buffer_size)
        self.subpartitions = [Subpartition(self, i) for i in range(num_subpartitions)]
        self.spill: SpillFile | None = None if self.consume_once else SpillFile(Path(spill_dir) / _spill_name(pid))
        self._in_memory: deque[StoredBuffer] = deque()  # oldest first, for eviction
        self.finished = False
        self.failure: str | None = None
        self.released = False
        self.arenas: set = set()  # writers' shared-memory arenas holding buffers of this partition
        self.pinned = 0  # buffers sent to local readers by reference and not copied yet
        self.on_slots_freed: Callable[[int], None] = lambda arena_slot: None  # a slot freed; its arena slot or -1
        self.created = time.monotonic()
        self.bytes_in = 0
        self.buffers_in = 0
        self.backpressure_seconds = 0.0  # time the writer waited for credit, reported by the producer

    # ---------------------------------------------------------------- writing
    @property
    def free_slots(self) -> int:
        """The writer's credit: buffers it may push now."""
        if self.pool is None:
            return 1 << 20  # BLOCKING writes straight to disk
        return self.pool.free

    def add(self, subpartition: int, kind: int, flags: int, payload: bytes | memoryview, arena_slot: int = -1,
            arena=None, arena_offset: int = 0) -> None:
        if self.finished or self.released or self.failure:
            raise PartitionStateError(f"partition {self.pid} does not accept buffers any more")
        if subpartition == BROADCAST:
            targets = self.subpartitions
        elif 0 <= subpartition < self.num_subpartitions:
            targets = [self.subpartitions[subpartition]]
        else:
            raise PartitionStateError(
                f"subpartition index {subpartition} is out of range 0..{self.num_subpartitions - 1} of partition {self.pid}"
            )
        buf = StoredBuffer(kind, flags, len(payload), payload, pending_refs=len(targets), arena_slot=arena_slot,
                           arena=arena, arena_offset=arena_offset)
        if self.spill is not None:
            buf.spill = self.spill.append(payload)
        if self.blocking:
            buf.payload = None
        elif kind == BufferKind.DATA:
            if self.pool.free <= 0 and not self.consume_once:
                self._evict_oldest()
            buf.in_memory_slot = True
            self.pool.take(buf.size)
            self._in_memory.append(buf)
        if kind == BufferKind.DATA:
            self.bytes_in += buf.size
            self.buffers_in += 1
        for sub in targets:
            sub.append(buf)
        if not self.consume_once and self.pool is not None and self.pool.free <= 0:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        """HYBRID: the oldest in-memory buffer is on disk already; drop its memory."""
        while self._in_memory:
            buf = self._in_memory.popleft()
            if buf.in_memory_slot:
                self._drop_memory(buf)
                return

    def _drop_memory(self, buf: StoredBuffer) -> None:
        buf.in_memory_slot = False
        while self._in_memory and not self._in_memory[0].in_memory_slot:
            self._in_memory.popleft()  # keep the eviction queue as short as what memory holds
        if buf.spill is not None or buf.arena_slot >= 0:
            buf.payload = None  # an arena slot is the writer's again: read the spill file from now on
        if buf.pins:  # a local reader still copies it out of its slot: the slot is free after that
            buf.slot_free_pending = True
            return
        self._free_slot(buf)

    def _free_slot(self, buf: StoredBuffer) -> None:
        """The buffer's memory is needed by nobody: its pool slot (and arena slot) is credit again."""
        self.pool.give(buf.size)
        buf.arena = None
        self.on_slots_freed(buf.arena_slot)
        self._release_unused_arenas()

    def pin(self, buf: StoredBuffer) -> None:
        """A local reader is sent a reference to this buffer's slot instead of its bytes."""
        buf.pins += 1
        self.pinned += 1

    def unpin(self, buf: StoredBuffer) -> None:
        """A local reader has copied a shared buffer out of its slot."""
        buf.pins -= 1
        self.pinned -= 1
        if buf.pins <= 0 and buf.slot_free_pending:
            buf.slot_free_pending = False
            self._free_slot(buf)
        else:
            self._release_unused_arenas()

    def _release_unused_arenas(self) -> None:
        """A finished partition whose memory is all dropped needs no arena: give its shared memory back."""
        if self.finished and self.arenas and not self.pinned and (self.pool is None or self.pool.used == 0):
            for arena in self.arenas:
                arena.unlink()  # the pages go once the writer's and this mapping are gone too
            self.arenas.clear()

    def release_ref(self, buf: StoredBuffer) -> None:
        buf.pending_refs -= 1
        if buf.pending_refs <= 0 and buf.in_memory_slot:
            self._drop_memory(buf)
            if self.consume_once:
                buf.payload = None

    def finish(self) -> None:
        if self.failure:
            raise PartitionStateError(f"partition {self.pid} failed: {self.failure}")
        if self.finished:
            return
        for sub in self.subpartitions:
            sub.append(StoredBuffer(BufferKind.END_OF_PARTITION, 0, 0, b""))
        self.finished = True
        self._release_unused_arenas()
        if self.spill is not None:
            entries = [
                (sub.index, sub.base + i, b.spill[0] if b.spill else 0, b.size, b.kind, b.flags)
                for sub in self.subpartitions
                for i, b in enumerate(sub.entries)
            ]
            self.spill.write_index(entries)
        if self.blocking:
            for sub in self.subpartitions:
                for view in list(sub.views):
                    view.notify()

    def fail(self, reason: str) -> None:
        if self.finished or self.failure:
            return
        self.failure = f"producer of partition {self.pid} failed: {reason}"
        for sub in self.subpartitions:
            for view in list(sub.views):
                view.notify()

    # ---------------------------------------------------------------- reading
    def create_view(self, subpartition: int, resume_from: int, listener: Callable[[], None]) -> SubpartitionView:
        if self.released:
            raise PartitionStateError(f"partition {self.pid} was released")
        if not 0 <= subpartition < self.num_subpartitions:
            raise IndexError(
                f"subpartition index {subpartition} is out of range: partition {self.pid} has {self.num_subpartitions} subpartitions"
            )
        return self.subpartitions[subpartition].create_view(resume_from, listener)

    def read_spilled(self, buf: StoredBuffer) -> bytes:
        if buf.spill is None or self.spill is None:
            raise PartitionStateError(f"buffer of partition {self.pid} is neither in memory nor spilled")
        return self.spill.read(*buf.spill)

    # ---------------------------------------------------------------- lifecycle
    def release(self) -> None:
        if self.released:
            return
        self.released = True
        for sub in self.subpartitions:
            for view in list(sub.views):
                view.release()
            sub.entries.clear()
        if self.pool is not None:
            self.pool.close()
        if self.spill is not None:
            self.spill.delete()
        for arena in self.arenas:
            arena.unlink()  # readers that mapped it keep their mapping

    def stats(self) -> dict:
        return {
            "partition": self.pid,
            "exchange": self.exchange,
            "attempt": self.attempt,
            "type": self.partition_type,
            "subpartitions": self.num_subpartitions,
            "state": "failed" if self.failure else "finished" if self.finished else "running",
            "bytes": self.bytes_in,
            "buffers": self.buffers_in,
            "pool_slots": self.pool.slots if self.pool else 0,
            "pool_used": self.pool.used if self.pool else 0,
            "spill_bytes": self.spill.size if self.spill else 0,
            "spill_path": str(self.spill.path) if self.spill and self.finished else "",
            "backpressure_seconds": round(self.backpressure_seconds, 3),
            "age_seconds": round(time.monotonic() - self.created, 3),
        }
