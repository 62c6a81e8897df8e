"""A result partition's memory in one place: its local pool, pins, shared-memory arenas and eviction.

Where a pushed buffer lives and when its memory goes back is decided here,
not in the partition or its subpartitions (they only say "stored", "streamed
by every target", "pinned by a local reader", "finished"):

* ``PIPELINED_BOUNDED`` keeps every buffer in memory until every target has
  streamed it; its writer gets credit only for slots below its pool's target
  and within the free budget (else it waits: backpressure).
* ``HYBRID`` writes every buffer through to the spill file; memory is a cache
  for the running consumer. A buffer is kept only while the pool is below its
  target and the budget has room; otherwise the oldest buffers leave memory,
  and with no memory at all it goes to disk only. Its writer's credit never
  waits for memory. At finish all memory is given back (the data is on disk).
* ``BLOCKING`` holds no memory at all.

A slot (a :class:`MemorySlot`: one buffer, or one region of several) is freed
when none of its buffers holds it and no local reader still copies out of it;
its arena slot, if any, is then the writer's again (``on_slots_freed``).
"""
from __future__ import annotations

from typing import Any, Callable

from ..kinds import PartitionType
from .buffer_pool import SUBPARTITION_BYTES, BufferTooLarge, MemoryAccount, MemorySlot, NetworkBufferPool, StoredBuffer


class PartitionMemory:
    def __init__(self, network: NetworkBufferPool, partition_type: PartitionType, buffer_size: int, max_slots: int,
                 pid: str = "", width: int = 1, account: MemoryAccount | None = None) -> None:
        """``width``: its subpartitions, whose bookkeeping is charged (``SUBPARTITION_BYTES`` each);
        ``account``: its credential's share of the budget (None: the operator's, no share)."""
        self.pid = pid
        self.network = network
        self.account = account
        self.bookkeeping = width * SUBPARTITION_BYTES
        network.bookkeeping_bytes += self.bookkeeping
        self.waiting_for: str = ""  # why its bounded writer gets no credit now, when memory is the reason
        self.bounded = partition_type == PartitionType.PIPELINED_BOUNDED
        self.blocking = partition_type == PartitionType.BLOCKING
        self.buffer_size = buffer_size
        self.max_slots = max_slots
        self.pool = None if self.blocking else network.create_pool(buffer_size, max_slots)
        if self.pool is not None:
            self.pool.account = account
        # a spilling writer's credit does not wait for memory, but the frame it is sending is received
        # into memory before it reaches the spill file: one buffer's worth is set aside while it runs
        self._receiving = 0 if self.bounded else buffer_size
        network.promised_bytes += self._receiving
        network.note_peak()
        if account is not None:
            account.bytes += self._receiving + self.bookkeeping
        self._slots: dict[MemorySlot, None] = {}  # slots holding buffers, oldest first (eviction order)
        self.arenas: set = set()  # writers' shared-memory arenas holding buffers of this partition
        self.pinned = 0  # buffers sent to local readers by reference and not copied yet
        self.finished = False
        self.released = False
        self.on_slots_freed: Callable[[int], None] = lambda arena_slot: None  # a slot freed; its arena slot or -1

    def set_on_credit(self, callback: Callable[[], None]) -> None:
        """Called when the pool's target or the free budget grew: the writer may get more credit."""
        if self.pool is not None:
            self.pool.on_available = callback

    # ------------------------------------------------------------ credit
    def grant(self, outstanding: int, cap: int, pending: int = 0) -> int:
        """New credit for a writer holding ``outstanding`` unused credits, at most ``cap`` in all;
        ``pending`` freed slots are not yet announced to it. Bounded credit is promised memory."""
        if self.finished or self.released:
            return 0
        room = cap - outstanding
        if not self.bounded:
            return max(0, room)  # HYBRID spills and BLOCKING writes to disk: memory never holds a writer back
        pool = self.pool
        local = pool.target - pool.used - pool.promised - pending
        free = pool.free_bytes // self.buffer_size
        new = min(local, free, room)
        if new > 0:
            self.waiting_for = ""
            pool.promise(new)
            return new
        if local > 0 and free <= 0:
            self.network.wait(pool)
            self.waiting_for = self._short_of_memory()
        elif pool.target == 0:  # the budget's shares left it no slot
            self.waiting_for = self._short_of_memory()
        return 0

    def _short_of_memory(self) -> str:
        """Why no memory is free for its writer: the budget, or its credential's share of it."""
        if self.account is not None and self.account.free < self.buffer_size <= self.network.free_bytes:
            return f"waiting for memory: {self.account.describe()}"
        return (f"waiting for memory: memory.budget is full ({self.network.reserved_bytes} of "
                f"{self.network.total_bytes} bytes held or promised by {len(self.network.pools)} running partitions)")

    def forfeit(self) -> None:
        """A credit was spent on a push that was refused: its promised memory goes back."""
        if self.bounded and self.pool.promised > 0:
            self.pool.promise(-1)
            self.network._freed()

    @property
    def free_slots(self) -> int:
        """Buffers the writer could push now (without the credit already promised)."""
        if self.pool is None or not self.bounded:
            return 1 << 20
        return self.pool.free

    # ------------------------------------------------------------ storing
    def hold(self, bufs: list[StoredBuffer], nbytes: int, arena_slot: int = -1, arena: Any = None) -> None:
        """``bufs`` (one buffer or a region's pieces, ``nbytes`` in all) arrived: keep them in memory or not."""
        owner = getattr(bufs[0].payload, "obj", None)
        if arena is None and isinstance(owner, bytearray):
            nbytes = max(nbytes, len(owner))  # a receive buffer (rounded up, maybe reused): all of it is held
        charge = max(self.buffer_size, nbytes)
        if self.blocking:
            for buf in bufs:
                buf.payload = None  # on disk only
            return
        if self.bounded:
            if charge > self.network.total_bytes:
                raise BufferTooLarge(
                    f"a buffer of {nbytes} bytes for PIPELINED_BOUNDED partition {self.pid} cannot fit memory.budget "
                    f"({self.network.total_bytes} bytes) at all (raise spark.sparkflow.exchange.memory.budget, or use "
                    "partitionType HYBRID, which spills)")
            self._keep(bufs, charge, arena_slot, arena)  # the writer had credit: the memory was promised
            return
        pool = self.pool
        while self._slots and not pool.fits(charge):
            self._evict_oldest()
        if pool.fits(charge):
            self._keep(bufs, charge, arena_slot, arena)
            if pool.used >= pool.max_slots:  # keep an arena slot free: a HYBRID writer never waits
                self._evict_oldest()
            return
        for buf in bufs:  # no memory free: the spill file is the only copy
            buf.payload = None
        if arena_slot >= 0:
            self.on_slots_freed(arena_slot)

    def _keep(self, bufs: list[StoredBuffer], charge: int, arena_slot: int, arena: Any) -> None:
        slot = MemorySlot(charge, arena_slot, arena, held=len(bufs), buffers=bufs)
        for buf in bufs:
            buf.mem = slot
            buf.in_memory = True
        self.pool.take(charge)
        self._slots[slot] = None

    def _evict_oldest(self) -> None:
        """HYBRID: the oldest slot's buffers are on disk already; drop their memory."""
        if self._slots:
            slot = next(iter(self._slots))
            for buf in slot.buffers:
                self.drop(buf)

    def drop(self, buf: StoredBuffer) -> None:
        """The buffer's memory is no longer needed (streamed by every target, or evicted)."""
        if not buf.in_memory:
            return
        buf.in_memory = False
        buf.payload = None  # HYBRID reads the spill file from now on; a bounded buffer was sent
        slot = buf.mem
        slot.held -= 1
        if slot.held <= 0:
            self._slots.pop(slot, None)
            if slot.pins <= 0:
                self._free(slot)

    def _free(self, slot: MemorySlot) -> None:
        """Nobody needs the slot's memory: its bytes are budget again, its arena slot the writer's."""
        slot.freed = True
        slot.arena = None
        slot.buffers = []
        if self.released:
            return
        self.pool.give(slot.charge)
        self.on_slots_freed(slot.arena_slot)
        self._release_unused_arenas()

    # ------------------------------------------------------------ local readers
    def pin(self, buf: StoredBuffer) -> None:
        """A local reader is sent a reference to this buffer's slot instead of its bytes."""
        buf.mem.pins += 1
        self.pinned += 1

    def unpin(self, buf: StoredBuffer) -> None:
        """A local reader has copied a shared buffer out of its slot."""
        slot = buf.mem
        slot.pins -= 1
        self.pinned -= 1
        if slot.pins <= 0 and slot.held <= 0 and not slot.freed:
            self._free(slot)
        else:
            self._release_unused_arenas()

    def _release_unused_arenas(self) -> None:
        """A finished partition whose memory is all dropped needs no arena: give its shared memory back."""
        if self.finished and self.arenas and not self.pinned and (self.pool is None or self.pool.used == 0):
            for arena in self.arenas:
                arena.unlink()  # the pages go once the writer's and this mapping are gone too
            self.arenas.clear()

    # ------------------------------------------------------------ lifecycle
    def _stop_receiving(self) -> None:
        if self._receiving:
            self.network.promised_bytes -= self._receiving
            if self.account is not None:
                self.account.bytes -= self._receiving
            self._receiving = 0
            self.network._freed()

    def finish(self) -> None:
        """The writer is done: a spilling partition gives all its memory back, a bounded one keeps
        what its consumers have not taken; neither gets a target any more."""
        if self.finished:
            return
        self.finished = True
        self._stop_receiving()
        if self.pool is not None:
            if not self.bounded:
                while self._slots:
                    self._evict_oldest()
            self.pool.close()
        self._release_unused_arenas()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.finished = True
        self._stop_receiving()
        pool = self.pool
        if pool is not None:
            self.network.used_bytes -= pool.used_bytes
            pool._charge(-pool.used_bytes)
            pool.used = pool.used_bytes = 0
            pool.close()
        self.network.bookkeeping_bytes -= self.bookkeeping
        if self.account is not None:
            self.account.bytes -= self.bookkeeping
        self.bookkeeping = 0
        for slot in self._slots:
            slot.buffers = []
        self._slots.clear()
        for arena in self.arenas:
            arena.unlink()  # readers that mapped it keep their mapping
        self.arenas.clear()

    def stats(self) -> dict:
        pool = self.pool
        return {
            "pool_slots": pool.target if pool else 0,
            "pool_max_slots": pool.max_slots if pool else 0,
            "pool_used": pool.used if pool else 0,
            "pool_bytes": pool.used_bytes if pool else 0,
            "pinned": self.pinned,
            "waiting_for": self.waiting_for if not self.finished else "",
        }
