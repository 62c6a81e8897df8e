"""The producer's end of a result partition: pushes buffers into the service under credit.

Flink's ResultPartitionWriter as seen from a task: the service grants one
credit per free slot of the partition's pool; with no credit the writer
blocks reading credit announcements. That wait is backpressure, measured as
Flink's ``backPressuredTimeMsPerSecond``. On the service's host the writer
serialises batches straight into the pool's slots in shared memory
(``partition/shared_arena.py``) and pushes only their place.
"""
from __future__ import annotations

import threading
import time
from collections import deque

import pyarrow as pa

from ..buffer import BatchEncoder, Region
from ..buffer_kinds import BufferKind
from ..errors import ErrorCode, ExchangeError, NoConsumerError, ServiceError, error_for
from ..kinds import PartitionType
from ..network.blocking_client import BlockingConnection
from ..network.protocol import (
    ErrorResponse,
    FailPartition,
    FinishPartition,
    PartitionFinished,
    PartitionRegistered,
    PartitionReleased,
    ProducerCredit,
    PushBuffer,
    PushRegion,
    PushSharedBuffer,
    PushSharedRegion,
    RegisterPartition,
    SlotsFreed,
)
from ..partition import shared_arena
from ..partition.shared_arena import ArenaError, SharedArena


class PartitionAbandoned(RuntimeError):
    """The task aborted its write while a push waited for credit."""


class PartitionWriter:
    CREDIT_POLL = 0.2  # how often a credit wait looks at abandon() and the no-consumer deadline
    LOOK_EVERY = 0.5  # a writer with credit still reads the service's news this often (a release: at once)
    def __init__(self, conn: BlockingConnection, partition: str, num_subpartitions: int, partition_type: str,
                 exchange: str = "", attempt: str = "", no_consumer_timeout: float = 300.0,
                 buffer_size: int = 0, buffers: int = 0, shared_memory: bool = False) -> None:
        self.conn = conn
        self.partition = partition
        self.partition_type = partition_type
        self.no_consumer_timeout = no_consumer_timeout
        self.lock = threading.Lock()  # the output flusher pushes from its own thread
        self.credit = 0
        self.abandoned: str | None = None  # set by abandon(): credit waits end
        self.released: ExchangeError | None = None  # the service released the partition: every call fails so
        self._next_look = 0.0  # when a push with credit reads the service's news next
        self.handle = 0
        self.backpressure_seconds = 0.0
        self.bytes_pushed = 0
        self.buffers_pushed = 0
        self.buffers_shared = 0  # of those, written into a shared-memory slot
        self.regions_pushed = 0  # pushes that carried several subpartitions' buffers (counted once in buffers_pushed)
        self.started = time.monotonic()
        self.arena = self._create_arena(buffers, buffer_size) if shared_memory and partition_type != PartitionType.BLOCKING \
            and conn.address.is_unix else None
        self.free_slots: deque[int] = deque()
        arena = self.arena
        try:
            conn.send(RegisterPartition(partition, num_subpartitions, partition_type, exchange, attempt,
                                        buffer_size, buffers, str(arena.path) if arena else "",
                                        arena.slots if arena else 0, arena.slot_size if arena else 0))
            self._await_registration()
        finally:
            if arena is not None:
                arena.unlink()  # the service has mapped it (or refused it): the name is no longer needed

    @staticmethod
    def _create_arena(buffers: int, buffer_size: int) -> SharedArena | None:
        if buffers < 1 or buffer_size < 1 or not shared_arena.available():
            return None
        try:
            return SharedArena.create(buffers, buffer_size + shared_arena.SLOT_SLACK)
        except ArenaError:
            return None

    def _await_registration(self) -> None:
        conn = self.conn
        partition = self.partition
        deadline = time.monotonic() + conn.timeout
        while not self.handle:
            msg = conn.recv(max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise error_for(ErrorCode.TIMEOUT, f"the exchange service did not register partition {partition}")
            self._on_message(msg)

    def _on_message(self, msg) -> None:
        handle = getattr(msg, "handle", None)
        if self.handle and handle is not None and handle != self.handle:
            return  # about a partition this connection wrote before (a pooled connection): not ours
        if isinstance(msg, PartitionRegistered):
            if msg.partition != self.partition:
                return
            self.handle = msg.handle
            if msg.shm_slots and self.arena is not None:
                self.free_slots.extend(range(min(msg.shm_slots, self.arena.slots)))
            else:
                self.arena = None
        elif isinstance(msg, SlotsFreed):
            self.free_slots.extend(msg.slots)
        elif isinstance(msg, ProducerCredit):
            self.credit += msg.credit
        elif isinstance(msg, PartitionReleased):
            if msg.handle == self.handle:
                replaced = msg.code == ErrorCode.REPLACED  # else released: ExchangeReplaced, PartitionReleasedError
                self.released = error_for(ErrorCode.REPLACED if replaced else ErrorCode.RELEASED, msg.message + (
                    "; the write cannot be committed: write the exchange again" if replaced else ""))
                raise self.released
        elif isinstance(msg, ErrorResponse):
            raise error_for(msg.code, f"exchange service refused partition {self.partition}: {msg.message}")

    def push(self, subpartition: int, payload, kind: int = BufferKind.DATA, flags: int = 0) -> None:
        """Send one buffer; blocks while the partition's pool is full (no credit)."""
        with self.lock:
            self._take_credit()
            self._send_payload(subpartition, payload, kind, flags)

    def push_batch(self, subpartition: int, batch: pa.RecordBatch, encoder: BatchEncoder) -> None:
        """Serialise and send one data buffer: into a shared slot when there is one, else over the socket."""
        with self.lock:
            self._take_credit()
            if self.free_slots:
                slot = self.free_slots.popleft()
                placed = encoder.encode_into(batch, self.arena.slot(slot))
                if placed is not None:
                    offset, length = placed
                    self.conn.send(PushSharedBuffer(self.handle, subpartition, BufferKind.DATA, encoder.last_flags,
                                                    slot, offset, length))
                    self._count(length)
                    self.buffers_shared += 1
                    return
                self.free_slots.appendleft(slot)  # too big for a slot: this one goes over the socket
            payload = encoder.encode(batch)
            self._send_payload(subpartition, payload, BufferKind.DATA, encoder.last_flags)

    def push_encoded(self, subpartition: int, payload: pa.Buffer, flags: int) -> None:
        """Send one already serialised data buffer: copied into a shared slot when there is one."""
        with self.lock:
            self._take_credit()
            if self.free_slots and len(payload) <= self.arena.slot_size:
                slot = self.free_slots.popleft()
                self.arena.slot(slot)[:len(payload)] = memoryview(payload).cast("B")
                self.conn.send(PushSharedBuffer(self.handle, subpartition, BufferKind.DATA, flags, slot, 0,
                                                len(payload)))
                self._count(len(payload))
                self.buffers_shared += 1
                return
            self._send_payload(subpartition, payload, BufferKind.DATA, flags)

    def push_region(self, region: Region, flags: int) -> None:
        """Send several subpartitions' small buffers for one credit (FLIP-148's region)."""
        with self.lock:
            self._take_credit()
            pieces = region.pieces()
            if self.free_slots and region.nbytes <= self.arena.slot_size:
                slot = self.free_slots.popleft()
                region.write_into(self.arena.slot(slot))
                self.conn.send(PushSharedRegion(self.handle, BufferKind.DATA, flags, slot, pieces))
                self.buffers_shared += 1
            else:
                self.conn.send(PushRegion(self.handle, BufferKind.DATA, flags, pieces, region.payload()))
            self._count(region.nbytes)
            self.regions_pushed += 1

    def _take_credit(self) -> None:
        if self.released is not None:
            raise self.released
        if self.credit <= 0 or time.monotonic() >= self._next_look:
            self._look()  # credit announcements that already arrived, or a release
            if self.credit <= 0:
                self._wait_for_credit()
        self.credit -= 1

    def _look(self) -> None:
        self._next_look = time.monotonic() + self.LOOK_EVERY
        for msg in self.conn.poll():
            self._on_message(msg)

    def check(self) -> None:
        """Between batches (task thread): fail now if the service released the partition. Reads the
        service's news at most every LOOK_EVERY s, and not while the output flusher holds the connection."""
        if self.released is not None:
            raise self.released
        if time.monotonic() < self._next_look or not self.lock.acquire(blocking=False):
            return
        try:
            self._look()
        finally:
            self.lock.release()

    def _send_payload(self, subpartition: int, payload, kind: int, flags: int) -> None:
        self.conn.send(PushBuffer(self.handle, subpartition, kind, flags, payload))
        self._count(len(payload))

    def _count(self, nbytes: int) -> None:
        self.bytes_pushed += nbytes
        self.buffers_pushed += 1

    def abandon(self, reason: str) -> None:
        """From another thread: whoever waits for credit stops waiting (within a poll interval) and fails."""
        self.abandoned = reason

    def _wait_for_credit(self) -> None:
        start = time.monotonic()
        try:
            while self.credit <= 0:
                if self.abandoned is not None:
                    raise PartitionAbandoned(f"partition {self.partition} was abandoned while waiting for credit: "
                                             f"{self.abandoned}")
                waited = time.monotonic() - start
                if waited > self.no_consumer_timeout:
                    raise NoConsumerError(
                        f"partition {self.partition} ({self.partition_type}) has been full for {waited:.0f} s: no consumer "
                        "is reading it, or the service has no memory for it (pipelined.noConsumerTimeout; the "
                        "partition's waiting_for in the service's status says when memory is why: memory.budget, or "
                        "its credential's credentialMemoryShare). Start the read, or use partitionType HYBRID, "
                        "which spills instead of blocking")
                msg = self.conn.recv(min(self.CREDIT_POLL, self.no_consumer_timeout - waited + 0.01))
                if msg is not None:
                    self._on_message(msg)
        finally:
            self.backpressure_seconds += time.monotonic() - start

    def finish(self, counts: dict | None = None) -> dict:
        """End the partition; ``counts`` ({"buffers": [...], "rows": [...]} per subpartition) let the service
        check that it stored every buffer, and the readers that they got every buffer and row."""
        with self.lock:
            if self.released is not None:
                raise self.released
            self.conn.send(FinishPartition(self.handle, counts))
            while True:
                msg = self.conn.recv(self.conn.timeout)
                if msg is None:
                    raise error_for(ErrorCode.TIMEOUT,
                                    f"the exchange service did not confirm finishing partition {self.partition}")
                if isinstance(msg, PartitionFinished):
                    return msg.stats
                self._on_message(msg)

    def fail(self, reason: str) -> None:
        try:
            with self.lock:
                self.conn.send(FailPartition(self.handle, reason))
        except ServiceError:  # the connection is gone: the service fails the partition for it
            pass

    def backpressure_ratio(self) -> float:
        """Seconds waited for credit per second of writing (Flink's backPressuredTimeMsPerSecond / 1000)."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return self.backpressure_seconds / elapsed


class ReplicatedWriter:
    """A partition written to its own service and, buffer for buffer, to replicas on other hosts' services.

    Each replica is the same partition (same id, same buffers in the same order, so the same sequence numbers)
    in another service, pushed as the buffers are written: a reader that loses the partition's service goes on
    from a replica at the sequence it reached. ``finish`` returns only when every replica confirmed every
    buffer (its counts checked like the partition's own), so a write whose replica failed never commits. A
    failing replica fails the write with ``ReplicaLost`` naming its service (a retry places its replica anew).
    """

    def __init__(self, primary: PartitionWriter, replicas: list[tuple[PartitionWriter, dict]]) -> None:
        """``replicas``: each replica's writer and its service's location."""
        self.primary = primary
        self.replicas = replicas
        self.order = threading.Lock()  # every copy gets the buffers in one order, whichever thread pushes

    def __getattr__(self, name: str):  # counters and settings: the partition's own writer's
        return getattr(self.primary, name)

    @property
    def backpressure_seconds(self) -> float:
        return self.primary.backpressure_seconds + sum(w.backpressure_seconds for w, _ in self.replicas)

    def _each_replica(self, act) -> None:
        for writer, where in self.replicas:
            try:
                act(writer)
            except ServiceError as exc:
                if exc.code in (ErrorCode.REPLACED, ErrorCode.RELEASED):
                    raise  # the exchange or this attempt went: the partition's own writer says so too
                raise error_for(ErrorCode.REPLICA_LOST, f"the replica of partition {writer.partition} on exchange "
                                f"service {where.get('service_id')} (host {where.get('host_id')}, {where.get('tcp')}) "
                                f"failed: {exc}; the write cannot commit without it (a retry of the task places its "
                                "replica on a live service)") from exc

    def push(self, subpartition: int, payload, kind: int = BufferKind.DATA, flags: int = 0) -> None:
        with self.order:
            self.primary.push(subpartition, payload, kind, flags)
            self._each_replica(lambda w: w.push(subpartition, payload, kind, flags))

    def push_batch(self, subpartition: int, batch: pa.RecordBatch, encoder: BatchEncoder) -> None:
        payload = encoder.encode(batch)  # serialised once for every copy
        self.push_encoded(subpartition, payload, encoder.last_flags)

    def push_encoded(self, subpartition: int, payload: pa.Buffer, flags: int) -> None:
        with self.order:
            self.primary.push_encoded(subpartition, payload, flags)
            self._each_replica(lambda w: w.push_encoded(subpartition, payload, flags))

    def push_region(self, region: Region, flags: int) -> None:
        with self.order:
            self.primary.push_region(region, flags)
            self._each_replica(lambda w: w.push_region(region, flags))

    def check(self) -> None:
        self.primary.check()
        self._each_replica(lambda w: w.check())

    def finish(self, counts: dict | None = None) -> dict:
        """Every replica's service confirmed every buffer, then the partition's own: its stats."""
        self._each_replica(lambda w: w.finish(counts))
        return self.primary.finish(counts)

    def abandon(self, reason: str) -> None:
        for writer in [self.primary, *(w for w, _ in self.replicas)]:
            writer.abandon(reason)

    def fail(self, reason: str) -> None:
        for writer in [self.primary, *(w for w, _ in self.replicas)]:
            writer.fail(reason)

    def close_replicas(self) -> None:
        """The replicas' connections (each used by this partition alone) are closed."""
        for writer, _ in self.replicas:
            writer.conn.close()
