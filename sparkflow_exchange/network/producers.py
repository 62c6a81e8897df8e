"""Producer credit and shared-memory slots on the service's side, sans-IO.

The partitions one connection writes (Flink's credit-based producer side, beside the readers'
``credit.py``): credit is granted as the partition's memory allows (``partition_memory.py``), a
push spends one, and with a writer on this host the writer's arena slots are tracked - a slot is
in use from the push that fills it until the partition frees it, and it is announced free
(:class:`SlotsFreed`) only after the callback that freed it returned, since the payload may be on its
way into a transport right then. The connection gives this object a ``send`` and a ``defer``
(call soon); nothing here touches a socket or an event loop.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Callable

from ..buffer_kinds import BufferKind
from ..errors import ErrorCode, code_of
from ..exhaustion import explain
from ..partition.shared_arena import ArenaError, SharedArena
from .protocol import (
    ErrorResponse,
    FinishPartition,
    Message,
    PartitionFinished,
    PartitionRegistered,
    PartitionReleased,
    ProducerCredit,
    ProtocolError,
    PushBuffer,
    PushRegion,
    PushSharedBuffer,
    PushSharedRegion,
    RegisterPartition,
    SlotsFreed,
)

if TYPE_CHECKING:
    from ..partition.result_partition import ResultPartition

log = logging.getLogger(__name__)

MAX_GRANT = 64  # credit granted to a BLOCKING writer at a time
Push = PushBuffer | PushSharedBuffer | PushRegion | PushSharedRegion


class Producer:
    """One partition a connection writes: its credit, its arena slots, how long it waited for credit."""

    def __init__(self, partition: "ResultPartition", arena: SharedArena | None = None) -> None:
        self.partition = partition
        self.arena = arena  # the writer's shared-memory slots, on the same host
        self.slots_in_use: set[int] = set()
        self.slots_freed: list[int] = []  # announced to the writer once the current callback is done
        self.announce_scheduled = False
        self.outstanding = 0  # credit granted and not used yet
        self.started = time.monotonic()
        self.blocked_since: float | None = None  # the writer has no credit since then
        self.blocked_seconds = 0.0
        self.release_code = ErrorCode.RELEASED  # what its writer was told when the partition was released

    @property
    def active(self) -> bool:
        part = self.partition
        return not (part.finished or part.failure or part.released)

    def set_blocked(self, blocked: bool) -> None:
        now = time.monotonic()
        if blocked and self.blocked_since is None:
            self.blocked_since = now
        elif not blocked and self.blocked_since is not None:
            self.blocked_seconds += now - self.blocked_since
            self.blocked_since = None

    def backpressure_ratio(self) -> float:
        """Share of the writer's time spent without credit (Flink's backPressuredTimeMsPerSecond / 1000)."""
        now = time.monotonic()
        blocked = self.blocked_seconds + (now - self.blocked_since if self.blocked_since is not None else 0.0)
        return blocked / max(now - self.started, 1e-9)


class Producers:
    """The partitions one connection writes, by handle."""

    def __init__(self, send: Callable[[Message], None], defer: Callable[[Callable[[], None]], None],
                 lost: Callable[["ResultPartition", str], None]) -> None:
        self.send = send
        self.defer = defer
        self.lost = lost  # fail a partition whose writer cannot finish it (its readers hear why)
        self.by_handle: dict[int, Producer] = {}
        self._handles = itertools.count(1)
        self.closed = False  # the connection is gone: nothing more is sent

    def values(self):
        return self.by_handle.values()

    def get(self, handle: int) -> Producer:
        producer = self.by_handle.get(handle)
        if producer is None:
            raise ProtocolError(f"unknown partition handle {handle} on this connection")
        return producer

    # ------------------------------------------------------------ lifecycle
    def register(self, msg: RegisterPartition, part: "ResultPartition", shared: bool) -> int:
        """Take a newly registered partition; ``shared``: the writer may push through its arena (same host)."""
        handle = next(self._handles)
        arena = self._attach_arena(msg, part) if shared else None
        self.by_handle[handle] = Producer(part, arena)
        part.on_slots_freed = lambda arena_slot: self.slot_freed(handle, arena_slot)
        part.memory.set_on_credit(lambda: self.grant(handle))
        part.on_released = lambda reason, code: self._on_released(handle, reason, code)
        self.send(PartitionRegistered(part.pid, handle, 0, part.memory.buffer_size, arena.slots if arena else 0))
        self.grant(handle)
        return handle

    @staticmethod
    def _attach_arena(msg: RegisterPartition, part: "ResultPartition") -> SharedArena | None:
        """Map the writer's arena when it sent one and the partition has a pool."""
        if not msg.shm_path or part.pool is None:
            return None
        try:
            arena = SharedArena.attach(msg.shm_path, min(msg.shm_slots, part.memory.max_slots), msg.shm_slot_size)
        except ArenaError as exc:
            log.info("partition %s pushes over the socket: %s", part.pid, exc)
            return None
        part.arenas.add(arena)  # the partition gives it back once it needs it no more
        return arena

    def finish(self, msg: FinishPartition) -> None:
        """End a partition: checked against the writer's counts, then done with on this connection."""
        producer = self.get(msg.handle)
        producer.set_blocked(False)
        part = producer.partition
        if part.released:  # told already (maybe crossing this finish): told again
            self._tell_released(msg.handle, part.release_reason, producer.release_code)
            return
        lost = part.count_mismatch(msg.counts)
        if lost is not None:  # the partition fails (its readers hear so); the writer's task fails with this
            self.lost(part, lost)
            self.send(ErrorResponse(lost, None, False, ErrorCode.ROWS_LOST))
            return
        part.finish(msg.counts)
        stats = part.stats()
        # bytes per subpartition: the coordinator sums them at commit to size coalesced reads
        stats["subpartition_bytes"] = [sub.bytes_added for sub in part.subpartitions]
        self.send(PartitionFinished(msg.handle, stats))
        self.detach(msg.handle)  # the connection may carry the writer's next partition

    def detach(self, handle: int) -> None:
        """Forget a partition. It outlives the connection's interest: it must not keep the connection (and
        through it the writer's arena mapping, bufferSize x buffersPerPartition of shared memory) alive."""
        producer = self.by_handle.pop(handle, None)
        if producer is None:
            return
        producer.partition.on_slots_freed = lambda arena_slot: None
        producer.partition.memory.set_on_credit(lambda: None)
        producer.partition.on_released = None
        producer.arena = None

    def _on_released(self, handle: int, reason: str, code: ErrorCode) -> None:
        """The partition was released while written: its writer hears it now (credit never comes)."""
        producer = self.by_handle.get(handle)
        if producer is not None:
            producer.release_code = code
            producer.set_blocked(False)
            self._tell_released(handle, reason, code)

    def _tell_released(self, handle: int, reason: str, code: ErrorCode) -> None:
        part = self.by_handle[handle].partition
        self.send(PartitionReleased(handle, f"partition {part.pid} of exchange {part.exchange!r} was released "
                                            f"while it was being written: {reason or 'released'}", code))

    def connection_lost(self, who: str) -> None:
        """Fail every partition still being written (``who``: the writer, for the message); forget them all."""
        self.closed = True
        for handle, producer in list(self.by_handle.items()):
            if producer.active:
                self.lost(producer.partition, f"connection of its writer ({who}) was lost before finish")
            self.detach(handle)

    # ------------------------------------------------------------ credit and slots
    def grant(self, handle: int) -> None:
        """Credit as the partition's memory allows, and, with an arena, no more than the writer has free
        slots for: a slot whose SlotsFreed has not gone out yet is not free."""
        producer = self.by_handle.get(handle)
        if producer is None or self.closed or not producer.active:
            return
        pending = len(producer.slots_freed)
        cap = MAX_GRANT
        if producer.arena is not None:
            cap = min(cap, producer.arena.slots - len(producer.slots_in_use) - pending)
        new = producer.partition.memory.grant(producer.outstanding, cap, pending)
        if new > 0:
            producer.outstanding += new
            self.send(ProducerCredit(handle, new))
        producer.set_blocked(producer.outstanding <= 0)

    def slot_freed(self, handle: int, arena_slot: int) -> None:
        """A pool slot is free (``arena_slot`` >= 0: it held that arena slot)."""
        producer = self.by_handle.get(handle)
        if producer is None or producer.arena is None:
            self.grant(handle)
            return
        if arena_slot >= 0:
            producer.slots_in_use.discard(arena_slot)
            producer.slots_freed.append(arena_slot)
        if not producer.announce_scheduled:
            producer.announce_scheduled = True
            self.defer(lambda: self._announce(handle))

    def _announce(self, handle: int) -> None:
        producer = self.by_handle.get(handle)
        if producer is None:
            return
        producer.announce_scheduled = False
        # a finished writer fills no slot any more (a spilling partition frees them all at finish)
        if producer.slots_freed and not self.closed and producer.active:
            self.send(SlotsFreed(handle, tuple(producer.slots_freed)))
        producer.slots_freed.clear()
        self.grant(handle)

    # ------------------------------------------------------------ pushes
    def push(self, msg: Push) -> None:
        """Spend one credit on a pushed buffer or region and add it to the partition. A malformed push is a
        :class:`ProtocolError`; one the partition refuses is told to the writer (the connection goes on)."""
        producer = self.get(msg.handle)
        payload, slot, offset = self._payload(msg, producer)
        part = producer.partition
        if producer.outstanding <= 0:
            raise ProtocolError(f"{type(msg).__name__} without credit for partition {part.pid}")
        producer.outstanding -= 1
        if part.released:  # sent before its writer heard of the release: dropped, the writer was told why
            return
        arena = producer.arena if slot >= 0 else None
        if arena is not None:
            producer.slots_in_use.add(slot)
        try:
            if isinstance(msg, (PushRegion, PushSharedRegion)):
                part.add_region(msg.kind, msg.flags, msg.pieces, payload, slot, arena, offset)
            else:
                part.add(msg.subpartition, msg.kind, msg.flags, payload, slot, arena, offset)
        except (RuntimeError, OSError, MemoryError) as exc:
            part.memory.forfeit()
            if arena is not None and slot in producer.slots_in_use:
                self.slot_freed(msg.handle, slot)
            if isinstance(exc, RuntimeError):
                self.send(ErrorResponse(f"{type(msg).__name__} refused: {exc}", None, False, ErrorCode.PUSH_FAILED))
            else:  # a full disk, say: the partition cannot be whole any more, its writer and readers hear why
                reason = explain(exc, f"storing a buffer of partition {part.pid}")
                self.lost(part, reason)
                self.send(ErrorResponse(reason, None, False, code_of(exc, ErrorCode.PUSH_FAILED)))
        self.grant(msg.handle)

    def _payload(self, msg: Push, producer: Producer) -> tuple[object, int, int]:
        """(payload, arena slot or -1, offset of the payload in the arena) of a push, checked."""
        if isinstance(msg, PushBuffer):
            return msg.payload, -1, 0
        name = type(msg).__name__
        pid = producer.partition.pid
        if msg.kind != BufferKind.DATA:
            raise ProtocolError(f"{name} for partition {pid}: kind {msg.kind} is not data")
        if isinstance(msg, PushRegion):
            return msg.payload, -1, 0
        arena = producer.arena
        if arena is None:
            raise ProtocolError(f"{name} for partition {pid}, which has no shared-memory arena")
        if not 0 <= msg.slot < arena.slots or msg.slot in producer.slots_in_use:
            state = "in use" if msg.slot in producer.slots_in_use else f"outside 0..{arena.slots - 1}"
            raise ProtocolError(f"{name} for partition {pid}: arena slot {msg.slot} is {state}")
        if isinstance(msg, PushSharedBuffer):
            if msg.offset + msg.length > arena.slot_size:
                raise ProtocolError(f"{name} for partition {pid}: {msg.length} bytes at offset {msg.offset} "
                                    f"do not fit a slot of {arena.slot_size} bytes")
            return (arena.slot(msg.slot)[msg.offset:msg.offset + msg.length], msg.slot,
                    msg.slot * arena.slot_size + msg.offset)
        end = max(offset + length for _sub, offset, length in msg.pieces)
        if end > arena.slot_size:
            raise ProtocolError(f"{name} for partition {pid}: a piece ends at byte {end}, outside the slot of "
                                f"{arena.slot_size} bytes")
        return arena.slot(msg.slot)[:end], msg.slot, msg.slot * arena.slot_size
