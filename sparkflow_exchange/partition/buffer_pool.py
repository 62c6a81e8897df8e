"""Buffers and the memory they occupy: the service-wide pool and each partition's local pool.

As Flink's NetworkBufferPool / LocalBufferPool, counted in bytes: the
service's ``memory.budget`` is one :class:`NetworkBufferPool`; every running
result partition has a :class:`LocalBufferPool` whose *target* (slots it may
fill) is redistributed whenever partitions come and go. Registration never
reserves anything, so it never fails; a pool above its target shrinks only as
its buffers are freed (never by dropping data), a pool whose target grew is
told so (more credit for its writer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(eq=False)
class MemorySlot:
    """One pool slot's memory: a pushed buffer, or a region of several buffers (FLIP-148).

    It is freed (its bytes go back to the pool, its arena slot to the writer)
    when none of its buffers holds it any more and no local reader still copies
    out of it.
    """

    charge: int  # bytes of the budget it occupies: max(bufferSize, its real size)
    arena_slot: int = -1  # the writer's shared-memory slot holding the payload, -1 = the service's memory
    arena: Any = None  # that slot's SharedArena (None once the slot is the writer's again)
    held: int = 0  # buffers whose memory is still in use
    pins: int = 0  # references sent to local readers that have not copied them yet
    freed: bool = False
    buffers: list["StoredBuffer"] = field(default_factory=list)


@dataclass(eq=False)
class StoredBuffer:
    """One stored buffer (an Arrow IPC message, maybe compressed), shared by broadcast targets."""

    kind: int
    flags: int
    size: int
    payload: bytes | memoryview | None  # None once only the spill file holds it
    spill: tuple[int, int] | None = None  # (offset, length) in the partition's data file
    pending_refs: int = 0  # target subpartitions that have not streamed it yet
    mem: MemorySlot | None = None  # the memory it lives in (kept after it was dropped, for a pinned reader)
    in_memory: bool = False  # whether it still holds its share of ``mem``
    arena_offset: int = 0  # where the payload starts in the arena file

    @property
    def arena(self) -> Any:
        return self.mem.arena if self.mem is not None else None


# what one subpartition's bookkeeping costs a service in memory, before any buffer (its object, its deques):
# measured at 1.8 KiB of RSS each (an empty 65,536-wide HYBRID partition: 116 MiB); charged to its
# credential's share
SUBPARTITION_BYTES = 2048


class MemoryAccount:
    """One application credential's share of ``memory.budget`` (``credentialMemoryShare``): what its
    partitions hold (buffers, credit promised to its writers, a receive buffer per running spilling
    partition, and :data:`SUBPARTITION_BYTES` per subpartition) never passes ``limit``, so one credential
    cannot take the memory another's writes need. The operator has no account."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.bytes = 0
        self.promised = 0  # of ``bytes``: credit granted to its bounded writers and not used yet

    @property
    def free(self) -> int:
        """What new credit or cached buffers may still take."""
        return self.limit - self.bytes

    @property
    def room(self) -> int:
        """What a new partition's fixed cost may take: credit already promised is not counted, since it is
        granted no further while the account is full (a new partition waits for credit, it is not refused)."""
        return self.limit - (self.bytes - self.promised)

    def describe(self) -> str:
        return (f"credential {self.name!r} holds {self.bytes} of its {self.limit} bytes of memory.budget "
                "(credentialMemoryShare)")


class BufferTooLarge(RuntimeError):
    """A buffer that could not fit ``memory.budget`` even if nothing else were held."""


class NetworkBufferPool:
    """The service's ``memory.budget`` in bytes, shared out as targets of the running local pools."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.bookkeeping_bytes = 0  # what the partitions' subpartitions cost besides their buffers (SUBPARTITION_BYTES)
        self.used_bytes = 0  # held by buffers in memory (every pool, running or not)
        self.promised_bytes = 0  # credit granted to bounded writers and not used yet
        self.peak_used_bytes = 0  # the most buffers ever held in memory at once
        self.peak_reserved_bytes = 0  # the most ever held or promised at once (a spilling partition's receive
        # buffer is promised beside the budget: see PartitionMemory)
        self.pools: dict[LocalBufferPool, None] = {}  # running pools, in registration order
        self._waiting: dict[LocalBufferPool, None] = {}  # pools whose writer waits for memory
        self._seq = 0
        self._wanted = 0  # bytes the running pools would hold at their maxima
        self._all_at_max = True  # every running pool's target is its maximum (the budget was never short)

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes - self.promised_bytes

    @property
    def reserved_bytes(self) -> int:
        """Bytes in use or promised (the status field ``reserved``)."""
        return self.used_bytes + self.promised_bytes

    def note_peak(self) -> None:
        """After memory was taken or promised: the peaks the status reports (``peak_used``, ``peak_reserved``)."""
        if self.used_bytes > self.peak_used_bytes:
            self.peak_used_bytes = self.used_bytes
        if self.used_bytes + self.promised_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.used_bytes + self.promised_bytes

    def create_pool(self, buffer_size: int, max_slots: int) -> "LocalBufferPool":
        """A running partition's pool: up to ``max_slots`` slots of ``buffer_size`` while memory is free."""
        self._seq += 1
        pool = LocalBufferPool(self, buffer_size, max(1, max_slots), self._seq)
        self.pools[pool] = None
        self._wanted += pool.max_slots * buffer_size
        if self._all_at_max and self._wanted <= self.total_bytes:
            pool.target = pool.max_slots  # room for everybody's maximum: nothing to redistribute
        else:
            self.redistribute()
        return pool

    def retire(self, pool: "LocalBufferPool") -> None:
        """The pool's partition stopped writing: it gets no target; what it holds it gives back as freed."""
        if pool in self.pools:
            del self.pools[pool]
            self._wanted -= pool.max_slots * pool.buffer_size
            pool.target = 0
            self._waiting.pop(pool, None)
            if not self._all_at_max:
                self.redistribute()

    def redistribute(self) -> None:
        """Water-filling: every running pool an equal share of the budget, capped at its maximum; whole
        slots left over go to the oldest pools. Grown pools are told. What finished partitions still
        hold (unconsumed bounded buffers) is not subtracted: it limits everybody through
        ``free_bytes`` and flows to whoever waits as it is freed."""
        pools = list(self.pools)
        if not pools:
            self._all_at_max = True
            return
        remaining = self.total_bytes
        targets: dict[LocalBufferPool, int] = {}
        # smallest wants first; among equals the newest first, so the oldest get what is left
        order = sorted(pools, key=lambda p: (p.max_slots * p.buffer_size, -p.seq))
        for i, pool in enumerate(order):
            share = remaining // (len(order) - i)
            slots = min(pool.max_slots, share // pool.buffer_size)
            targets[pool] = slots
            remaining -= slots * pool.buffer_size
        for pool in pools:
            if remaining >= pool.buffer_size and targets[pool] < pool.max_slots:
                targets[pool] += 1
                remaining -= pool.buffer_size
        self._all_at_max = all(targets[p] == p.max_slots for p in pools)
        for pool in pools:
            grew = targets[pool] > pool.target
            pool.target = targets[pool]
            if grew:
                pool.on_available()

    def wait(self, pool: "LocalBufferPool") -> None:
        """The pool's writer wants credit the free memory cannot give: told when memory comes back."""
        self._waiting[pool] = None

    def _freed(self) -> None:
        if self._waiting and self.free_bytes > 0:
            waiting = list(self._waiting)
            self._waiting.clear()
            for pool in waiting:
                pool.on_available()


class LocalBufferPool:
    """A partition's share of the budget: ``target`` slots now, at most ``max_slots``."""

    def __init__(self, network: NetworkBufferPool, buffer_size: int, max_slots: int, seq: int) -> None:
        self.network = network
        self.buffer_size = buffer_size
        self.max_slots = max_slots
        self.seq = seq
        self.target = 0  # slots it may fill now (set by the network pool)
        self.used = 0  # slots holding buffers
        self.used_bytes = 0
        self.promised = 0  # credit granted against memory and not used yet
        self.account: MemoryAccount | None = None  # its credential's share, when it has one
        self.on_available: Callable[[], None] = lambda: None  # memory or target grew: more credit may be due

    @property
    def slots(self) -> int:
        return self.target

    @property
    def free(self) -> int:
        """Slots the writer may fill now: below the target and within the free budget."""
        local = self.target - self.used - self.promised
        return max(0, min(local, self.free_bytes // self.buffer_size))

    @property
    def free_bytes(self) -> int:
        """What the budget, and its credential's share of it, have free."""
        free = self.network.free_bytes
        return free if self.account is None else min(free, self.account.free)

    def fits(self, charge: int) -> bool:
        """Room for one more buffer of ``charge`` bytes without passing the target, the budget or the share."""
        return self.used < self.target and self.free_bytes >= charge

    def _charge(self, nbytes: int) -> None:
        if self.account is not None:
            self.account.bytes += nbytes

    def _promise_charge(self, nbytes: int) -> None:
        if self.account is not None:
            self.account.bytes += nbytes
            self.account.promised += nbytes

    def promise(self, slots: int) -> None:
        self.promised += slots
        self.network.promised_bytes += slots * self.buffer_size
        self.network.note_peak()
        self._promise_charge(slots * self.buffer_size)

    def take(self, charge: int) -> None:
        """A slot now holds ``charge`` bytes (a promised slot, if there is one, turns into it)."""
        if self.promised > 0:
            self.promised -= 1
            self.network.promised_bytes -= self.buffer_size
            self._promise_charge(-self.buffer_size)
        self.used += 1
        self.used_bytes += charge
        self.network.used_bytes += charge
        self.network.note_peak()
        self._charge(charge)

    def give(self, charge: int) -> None:
        self.used -= 1
        self.used_bytes -= charge
        self.network.used_bytes -= charge
        self._charge(-charge)
        self.network._freed()

    def close(self) -> None:
        """Nothing is written any more: promised credit goes back, no target."""
        self.network.promised_bytes -= self.promised * self.buffer_size
        self._promise_charge(-self.promised * self.buffer_size)
        self.promised = 0
        self.network.retire(self)
        self.network._freed()


MemoryBudget = NetworkBufferPool  # the name the service and older tests know
