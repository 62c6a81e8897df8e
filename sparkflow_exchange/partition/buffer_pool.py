"""Buffers and their pools: the service-wide memory budget and each partition's share.

As Flink's NetworkBufferPool / LocalBufferPool: a partition's pool is a
number of buffer slots reserved from the service budget; a free slot is one
unit of the writer's credit, so a full pool is backpressure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class StoredBuffer:
    """One pushed buffer (an Arrow IPC message, maybe compressed), shared by broadcast targets."""

    kind: int
    flags: int
    size: int
    payload: bytes | memoryview | None  # None once only the spill file holds it
    spill: tuple[int, int] | None = None  # (offset, length) in the partition's data file
    pending_refs: int = 0  # target subpartitions that have not streamed it yet
    in_memory_slot: bool = False  # whether it occupies a pool slot
    arena_slot: int = -1  # the writer's shared-memory slot holding the payload, -1 = own memory
    arena: Any = None  # that slot's SharedArena
    arena_offset: int = 0  # where the payload starts in the arena file
    pins: int = 0  # local readers that were sent a reference and have not copied it yet
    slot_free_pending: bool = False  # memory dropped while pinned: free the slot at the last unpin


class BudgetExhausted(RuntimeError):
    pass


class MemoryBudget:
    """The service's ``memory.budget``, shared out as slots of ``buffer_size`` bytes."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.reserved_bytes = 0

    def reserve(self, slots: int, buffer_size: int, minimum: int = 1) -> int:
        available = (self.total_bytes - self.reserved_bytes) // buffer_size
        granted = min(slots, available)
        if granted < minimum:
            raise BudgetExhausted(
                f"memory.budget exhausted: {self.reserved_bytes} of {self.total_bytes} bytes are reserved "
                f"by other partitions; a partition needs at least {minimum} buffer(s) of {buffer_size} bytes "
                "(drop unused exchanges or raise spark.sparkflow.exchange.memory.budget)"
            )
        self.reserved_bytes += granted * buffer_size
        return granted

    def release(self, slots: int, buffer_size: int) -> None:
        self.reserved_bytes = max(0, self.reserved_bytes - slots * buffer_size)


class BufferPool:
    """A partition's in-memory slots."""

    def __init__(self, budget: MemoryBudget, slots: int, buffer_size: int) -> None:
        self.budget = budget
        self.buffer_size = buffer_size
        self.slots = budget.reserve(slots, buffer_size)
        self.used = 0
        self.used_bytes = 0

    @property
    def free(self) -> int:
        return self.slots - self.used

    def take(self, nbytes: int) -> None:
        self.used += 1
        self.used_bytes += nbytes

    def give(self, nbytes: int) -> None:
        self.used -= 1
        self.used_bytes -= nbytes

    def close(self) -> None:
        self.budget.release(self.slots, self.buffer_size)
        self.slots = 0
