"""A result partition: one Spark write-task attempt's output, split into subpartitions.

The three partition types differ only in where a buffer lives and when it
may be read:

* ``PIPELINED_BOUNDED``: memory only; a slot is freed when its buffer has been
  sent to every target, so a slow consumer stops the writer (credit = free slots).
* ``BLOCKING``: every buffer goes to the spill file at once; readable after finish.
* ``HYBRID``: every buffer is written through to the spill file and kept in
  memory for the pipelined consumer; memory is dropped once streamed, or the
  oldest buffers are dropped when the pool is full. Disk keeps it re-readable.
"""
from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path
from typing import Callable

from ..buffer_kinds import BROADCAST, END_COUNTS, FLAG_COMPRESSED, BufferKind
from ..errors import ErrorCode
from ..ipc_body import raw_size
from ..kinds import PartitionState, PartitionType
from .buffer_pool import MemoryAccount, NetworkBufferPool, StoredBuffer
from .partition_memory import PartitionMemory
from .spill import DiskBudget, DiskShare, FileSpan, SpillFile, SpillReaders
from .subpartition import Subpartition, SubpartitionView


class PartitionStateError(RuntimeError):
    pass


def _spill_name(pid: str) -> str:
    """A short file name for any partition id: up to 40 of its ASCII letters, digits, ``-_.`` (for people
    looking at the directory), a hash of the whole id, and a part unique per registration. Under 80
    bytes whatever the id (an exchange name of 80 CJK characters made a 250-byte name: ENAMETOOLONG)."""
    readable = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in pid)[:40]
    digest = hashlib.sha256(pid.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}-{uuid.uuid4().hex[:6]}.data"


class ResultPartition:
    def __init__(
        self,
        pid: str,
        num_subpartitions: int,
        partition_type: PartitionType | str,
        network: NetworkBufferPool,
        slots: int,
        buffer_size: int,
        spill_dir: Path,
        exchange: str = "",
        attempt: str = "",
        spill_readers: SpillReaders | None = None,
        disk: DiskBudget | DiskShare | None = None,
        account: MemoryAccount | None = None,
    ) -> None:
        """``slots`` is the most buffers its pool may hold (buffersPerPartition); how many it may hold
        now is the network pool's to say."""
        if num_subpartitions < 1:
            raise ValueError(f"a partition needs at least one subpartition, got {num_subpartitions}")
        self.pid = pid
        self.owner = ""  # the credential that registered it (service/owners.py), set by its service
        # who else may read it, as its writer named them (its exchange's readers; "*": every credential); None:
        # its writer named none, and every credential may
        self.readers: tuple[str, ...] | None = None
        self.exchange = exchange
        self.attempt = attempt
        self.partition_type = partition_type = PartitionType(partition_type)
        self.consume_once = partition_type.consume_once
        self.blocking = partition_type is PartitionType.BLOCKING
        self.num_subpartitions = num_subpartitions
        self.memory = PartitionMemory(network, partition_type, buffer_size, slots, pid, num_subpartitions, account)
        self.subpartitions = [Subpartition(self, i) for i in range(num_subpartitions)]
        self.spill: SpillFile | None = None if self.consume_once else \
            SpillFile(Path(spill_dir) / _spill_name(pid), spill_readers, disk)
        self.finished = False
        self.failure: str | None = None
        self.released = False
        self.release_reason = ""  # why (dropped, overwritten...): what its connected readers are told
        # told (reason, code) when the partition is released while its writer still writes it: the writer
        # learns at once instead of waiting for credit that never comes (set by the writer's connection)
        self.on_released: Callable[[str, str], None] | None = None
        self.created = time.monotonic()
        self.bytes_in = 0
        self.raw_bytes_in = 0  # bytes_in as they would be uncompressed (compressed buffers' IPC lengths)
        self.buffers_in = 0
        self.bytes_read = 0  # payload bytes its subpartitions served to readers (every view, every re-read)
        self.buffers_read = 0  # buffers its subpartitions served to readers, counted as bytes_read is
        self.file_bytes_read = 0  # bytes readers on this host read from its spill file themselves (reported)
        self.backpressure_seconds = 0.0  # time the writer waited for credit, reported by the producer

    # ---------------------------------------------------------------- memory (see partition_memory.py)
    @property
    def pool(self):
        return self.memory.pool

    @property
    def arenas(self) -> set:
        return self.memory.arenas

    @property
    def on_slots_freed(self) -> Callable[[int], None]:
        return self.memory.on_slots_freed

    @on_slots_freed.setter
    def on_slots_freed(self, callback: Callable[[int], None]) -> None:
        self.memory.on_slots_freed = callback

    @property
    def free_slots(self) -> int:
        """Buffers the writer could push now."""
        return self.memory.free_slots

    # ---------------------------------------------------------------- writing
    def _check_open(self) -> None:
        if self.finished or self.released or self.failure:
            raise PartitionStateError(f"partition {self.pid} does not accept buffers any more")

    def _check_index(self, subpartition: int) -> None:
        if not 0 <= subpartition < self.num_subpartitions:
            raise PartitionStateError(
                f"subpartition index {subpartition} is out of range 0..{self.num_subpartitions - 1} of partition {self.pid}"
            )

    def add(self, subpartition: int, kind: int, flags: int, payload: bytes | memoryview, arena_slot: int = -1,
            arena=None, arena_offset: int = 0) -> None:
        """One pushed buffer for one subpartition (or every one: ``BROADCAST``)."""
        self._check_open()
        if subpartition == BROADCAST:
            targets = self.subpartitions
        else:
            self._check_index(subpartition)
            targets = [self.subpartitions[subpartition]]
        buf = StoredBuffer(kind, flags, len(payload), payload, pending_refs=len(targets), arena_offset=arena_offset)
        if self.spill is not None:
            buf.spill = self.spill.append(payload)
        if kind == BufferKind.DATA:
            self.memory.hold([buf], buf.size, arena_slot, arena)
            self.bytes_in += buf.size
            self.raw_bytes_in += raw_size(payload) if flags & FLAG_COMPRESSED else buf.size
            self.buffers_in += 1
        elif self.blocking:  # events are small and need no slot
            buf.payload = None
        for sub in targets:
            sub.append(buf)

    def add_region(self, kind: int, flags: int, pieces, payload: bytes | memoryview, arena_slot: int = -1,
                   arena=None, arena_offset: int = 0) -> None:
        """A region (FLIP-148): piece ``(subpartition, offset, length)`` is one buffer
        ``payload[offset:offset+length]`` of its subpartition; the region takes one pool slot, freed
        when every piece's memory is dropped, and is appended to the spill file once."""
        self._check_open()
        if kind != BufferKind.DATA:
            raise PartitionStateError(f"a region of partition {self.pid} must hold data buffers, not kind {kind}")
        if not pieces:
            raise PartitionStateError(f"a region of partition {self.pid} has no pieces")
        view = memoryview(payload)
        for sub, offset, length in pieces:
            self._check_index(sub)
            if offset < 0 or length < 0 or offset + length > len(view):
                raise PartitionStateError(f"a piece of {length} bytes at {offset} lies outside the region's "
                                          f"{len(view)} bytes (partition {self.pid})")
        base = self.spill.append(view)[0] if self.spill is not None else None
        bufs = [StoredBuffer(kind, flags, length, view[offset:offset + length], pending_refs=1,
                             spill=(base + offset, length) if base is not None else None,
                             arena_offset=arena_offset + offset)
                for _sub, offset, length in pieces]
        self.memory.hold(bufs, len(view), arena_slot, arena)
        self.bytes_in += sum(b.size for b in bufs)
        self.raw_bytes_in += sum(raw_size(view[o:o + n]) for _s, o, n in pieces) if flags & FLAG_COMPRESSED \
            else sum(b.size for b in bufs)
        self.buffers_in += len(bufs)
        for (sub, _offset, _length), buf in zip(pieces, bufs):
            self.subpartitions[sub].append(buf)

    def release_ref(self, buf: StoredBuffer) -> None:
        """A target subpartition has streamed the buffer; the last one frees its memory."""
        buf.pending_refs -= 1
        if buf.pending_refs <= 0:
            self.memory.drop(buf)

    def count_mismatch(self, counts: dict | None) -> str | None:
        """What is lost, if the data buffers the writer says it pushed are not the ones stored here."""
        if counts is None:
            return None
        buffers = self._per_subpartition(counts, "buffers")
        rows = self._per_subpartition(counts, "rows")
        if buffers is None or rows is None:
            return f"partition {self.pid}: malformed counts at finish (want one or {self.num_subpartitions} " \
                   "entries of buffers and rows)"
        wrong = [(s.index, s.data_count, b) for s, b in zip(self.subpartitions, buffers) if s.data_count != b]
        if not wrong:
            return None
        listed = ", ".join(f"subpartition {i}: {got} stored, {want} pushed" for i, got, want in wrong[:5])
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        return (f"data lost in exchange {self.exchange!r}, partition {self.pid}: the writer pushed buffers the "
                f"service did not store ({listed}{more})")

    def _per_subpartition(self, counts: dict, key: str) -> list[int] | None:
        values = counts.get(key)
        if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
            return None
        if len(values) == 1:
            return values * self.num_subpartitions
        return values if len(values) == self.num_subpartitions else None

    def finish(self, counts: dict | None = None) -> None:
        """End every subpartition; its END_OF_PARTITION carries (data buffers, rows) so readers can check
        that they got everything (rows as the writer counted them, -1 if it did not say)."""
        if self.failure:
            raise PartitionStateError(f"partition {self.pid} failed: {self.failure}")
        if self.released:  # dropped or replaced while written: nothing of it is kept, not even an index
            raise PartitionStateError(self.released_message())
        if self.finished:
            return
        rows = self._per_subpartition(counts, "rows") if counts is not None else None
        rows = rows or [-1] * self.num_subpartitions
        ends = [END_COUNTS.pack(sub.data_count, r) for sub, r in zip(self.subpartitions, rows)]
        # appended to the spill file too, so a reader of the file alone sees the counts
        base = self.spill.append(b"".join(ends))[0] if self.spill is not None else None
        for i, (sub, end) in enumerate(zip(self.subpartitions, ends)):
            sub.end_counts = (sub.data_count, rows[i])
            spill = (base + i * END_COUNTS.size, END_COUNTS.size) if base is not None else None
            sub.append(StoredBuffer(BufferKind.END_OF_PARTITION, 0, END_COUNTS.size, end, spill=spill))
        self.finished = True
        if self.spill is not None:
            entries = [
                (sub.index, sub.base + i, b.spill[0] if b.spill else 0, b.size, b.kind, b.flags)
                for sub in self.subpartitions
                for i, b in enumerate(sub.entries)
            ]
            self.spill.write_index(entries)
            self.spill.close()  # written completely: reads go through the service's bounded fd cache
        self.memory.finish()
        if self.blocking:
            for sub in self.subpartitions:
                for view in list(sub.views):
                    view.notify()

    def fail(self, reason: str) -> None:
        if self.finished or self.failure:
            return
        self.failure = f"producer of partition {self.pid} failed: {reason}"
        self.memory.release()  # nobody may read it any more: its memory and fds go back now
        if self.spill is not None:
            self.spill.close()
        for sub in self.subpartitions:
            sub.entries.clear()
            sub.data_before.clear()
            sub.base = sub.data_count = 0
            for view in list(sub.views):
                view.notify()

    # ---------------------------------------------------------------- reading
    def released_message(self) -> str:
        return f"partition {self.pid} of exchange {self.exchange!r} was released: {self.release_reason or 'released'}"

    def create_view(self, subpartition: int, resume_from: int, listener: Callable[[], None], *,
                    resumed: bool = False) -> SubpartitionView:
        if self.released:
            raise PartitionStateError(self.released_message())
        if not 0 <= subpartition < self.num_subpartitions:
            raise IndexError(
                f"subpartition index {subpartition} is out of range: partition {self.pid} has {self.num_subpartitions} subpartitions"
            )
        return self.subpartitions[subpartition].create_view(resume_from, listener, resumed=resumed)

    def read_spilled(self, buf: StoredBuffer) -> bytes:
        if buf.spill is None or self.spill is None:
            raise PartitionStateError(f"buffer of partition {self.pid} is neither in memory nor spilled")
        return self.spill.read(*buf.spill)

    def spilled_span(self, buf: StoredBuffer) -> FileSpan:
        """A spilled buffer left in its file, for a connection that sends it from there (``os.sendfile``)."""
        if buf.spill is None or self.spill is None:
            raise PartitionStateError(f"buffer of partition {self.pid} is neither in memory nor spilled")
        return self.spill.span(*buf.spill)

    # ---------------------------------------------------------------- lifecycle
    def release(self, reason: str = "", code: ErrorCode = ErrorCode.RELEASED) -> None:
        """Free memory and spill file. Connected views are not dropped silently: each is told, and its
        next item is an error naming ``reason`` (the server sends it as an ErrorResponse at once); so is
        a writer still writing it (``code``: ``replaced`` for a drop, overwrite or expiry)."""
        if self.released:
            return
        self.released = True
        self.release_reason = reason
        if self.on_released is not None and not self.finished and self.failure is None:
            self.on_released(reason, code)
        self.on_released = None
        for sub in self.subpartitions:
            sub.entries.clear()
            sub.data_before.clear()
            sub.base = sub.data_count = 0
        viewed = False
        for sub in self.subpartitions:
            for view in list(sub.views):
                viewed = True
                view.notify()
        self.memory.release()
        if self.spill is not None:
            self.spill.delete()
        if not viewed:
            # each subpartition points back here: without this the partition and its subpartitions are a
            # cycle only the garbage collector frees, and a service dropping 200 x 200 exchanges spent
            # seconds in full collections. Views still attached need the way back (their next item is
            # the release error), so then the collector does it.
            self.subpartitions = []

    def stats(self) -> dict:
        return {
            "partition": self.pid,
            "exchange": self.exchange,
            "attempt": self.attempt,
            "type": self.partition_type,
            "subpartitions": self.num_subpartitions,
            "state": PartitionState.FAILED if self.failure else PartitionState.FINISHED if self.finished
            else PartitionState.RUNNING,
            "bytes": self.bytes_in,
            "raw_bytes": self.raw_bytes_in,  # what "bytes" would be uncompressed (equal when not compressed)
            "buffers": self.buffers_in,
            "bytes_read": self.bytes_read,
            "buffers_read": self.buffers_read,
            "file_bytes_read": self.file_bytes_read,
            **self.memory.stats(),
            "spill_bytes": self.spill.size if self.spill else 0,
            "spill_path": str(self.spill.path) if self.spill and self.finished else "",
            "backpressure_seconds": round(self.backpressure_seconds, 3),
            "age_seconds": round(time.monotonic() - self.created, 3),
        }
