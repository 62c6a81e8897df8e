"""Input channels: one per producer partition and subpartition (or range) a gate reads (Flink's
Local/Remote/UnknownInputChannel).

* every channel starts *pending* (Flink's UnknownInputChannel): the producer
  is known, the connection to its service is not up yet; then it becomes
* :class:`LocalFileInputChannel`: a finished HYBRID/BLOCKING partition on this
  host: its spill file is read directly (no service round trip);
* :class:`LocalInputChannel`: the producer's service is on this host: Unix socket.
* :class:`RemoteInputChannel`: any other host: TCP (TLS when configured).

All methods run on the process's IO thread, except :meth:`InputChannel.consumed`
which the gate schedules there once the reader is done with a buffer, and a
local-file channel's ``open``/``payloads``, which run on the task thread.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import pyarrow as pa

from ..buffer_kinds import END_COUNTS, FLAG_SHARED, BufferKind
from ..config import ExchangeConfig
from ..errors import ErrorCode, ServiceError
from ..kinds import ChannelState, PartitionState
from ..network.aio_client import ClientConnection, ClientRuntime, next_receiver_id
from ..network.protocol import (
    FRAME_POOL,
    AddCredit,
    BufferResponse,
    CancelPartitionRequest,
    ErrorResponse,
    PartitionRequest,
    ProtocolError,
    SharedBuffersRead,
    SharedRef,
)
from ..partition import shared_arena
from ..partition.shared_arena import ArenaError
from .buffer_manager import ChannelCredit, FloatingBufferPool
from .spill_data import OPEN_FILES, SpillData, open_spill_data

if TYPE_CHECKING:
    from ..description import ExchangeDescription


class Gate(Protocol):
    """What a channel asks of the gate that reads it (``input_gate.InputGate``): the read's settings and
    connections, and where its buffers, ends and failures go."""

    config: ExchangeConfig
    exchange: ExchangeDescription
    name: str
    secret: str | None
    host_id: str
    floating: FloatingBufferPool

    @property
    def runtime(self) -> ClientRuntime: ...

    def ssl_for(self, address: str) -> Any: ...

    def arena_reader(self) -> shared_arena.ArenaReader: ...

    def service_alive(self, pid: int) -> bool: ...

    def announce(self, announcements: list[tuple[ChannelCredit, int]]) -> None: ...

    def deliver(self, channel: "InputChannel", msg: BufferResponse) -> None: ...

    def deliver_end(self, channel: "InputChannel", counts: tuple[int, int] | None) -> None: ...

    def deliver_file(self, channel: "LocalFileInputChannel") -> None: ...

    def channel_finished(self, channel: "InputChannel") -> None: ...

    def channel_failed(self, channel: "InputChannel", message: str, code: ErrorCode | str) -> None: ...


class Channel:
    """What every channel of a gate has: its producer, a state, what it delivered, how it fails."""

    locality = "?"

    def __init__(self, gate: Gate, producer: dict, subpartition: int, end: int | None = None) -> None:
        self.gate = gate
        self.producer = producer
        self.partition: str = producer["partition"]
        self.subpartition = subpartition
        self.end = end  # a coalesced read: subpartitions [subpartition, end) as one sequence; None = just one
        self.receiver_id = next_receiver_id()
        self.state = ChannelState.PENDING
        self.data_received = 0
        self.bytes_received = 0
        # task thread: data buffers and rows the reader decoded, checked against the end-of-partition's counts
        self.buffers_read = 0
        self.rows_read = 0
        self.markers: list[bytes] = []  # MARKER events, in order (a stream's epoch marker)

    @property
    def key(self) -> tuple[str, int]:
        """What the gate knows this channel by: its producer attempt and (first) subpartition."""
        return (self.partition, self.subpartition)

    def where(self) -> str:
        """Which producer and subpartition(s) this channel reads, for error messages."""
        subs = f"subpartition {self.subpartition}" if self.end is None else \
            f"subpartitions {self.subpartition}..{self.end - 1}"
        return f"producer {self.producer.get('index')} (partition {self.partition}), {subs}"

    def describe(self) -> dict[str, Any]:
        return {"partition": self.partition, "producer": self.producer["index"], "locality": self.locality,
                "state": self.state, "buffers": self.data_received, "bytes": self.bytes_received}

    def fail(self, message: str, code: ErrorCode | str = ErrorCode.ERROR) -> None:
        if self.state.done:
            return
        self.state = ChannelState.FAILED
        self._release()
        self.gate.channel_failed(self, message, code)

    def _release(self) -> None:
        """Let go of the connection or file this channel holds."""


class InputChannel(Channel):
    """A channel fed by a service over a connection, under credit.

    If the connection drops while reading a re-readable partition (HYBRID,
    BLOCKING), the channel reconnects and asks for the rest from its next
    sequence number, re-announcing its empty buffers as the initial credit.
    """

    MAX_RECONNECTS = 3
    shared = False  # ask for buffers in shared memory by reference (readers on the service's host)

    def __init__(self, gate: Gate, producer: dict, subpartition: int, address: str,
                 end: int | None = None) -> None:
        super().__init__(gate, producer, subpartition, end)
        self.address = address
        self.credit = ChannelCredit(gate.config.buffers_per_channel, gate.floating, self.receiver_id)
        self.conn: ClientConnection | None = None
        self.next_seq = 0
        self.resumable = gate.exchange.partition_type.re_readable
        self.reconnects = 0
        # copies of the partition on other hosts' services (same buffers, same sequence numbers): where the read
        # goes on when the partition's own service is lost
        self.replicas = [r["location"] for r in producer.get("replicas") or ()
                         if r.get("state") in ("writing", "complete") and isinstance(r.get("location"), dict)]
        self.failed_over: list[str] = []  # the services this channel left, and why (for a failure's message)

    async def request(self) -> None:
        try:
            self.conn = await self.gate.runtime.connection(
                self.address, self.gate.secret, host_id=self.gate.host_id, ssl_ctx=self.gate.ssl_for(self.address),
                max_frame=self.gate.config.max_frame_size)
        except ServiceError as exc:
            if not self._fail_over(f"cannot reach it: {exc}"):
                self.fail(f"cannot reach the service holding partition {self.partition} ({self.address}): {exc}"
                          f"{self._replicas_tried()}")
            return
        if self.state != ChannelState.PENDING:
            return
        self.conn.channels[self.receiver_id] = self
        self.state = ChannelState.REQUESTED
        # every empty buffer is credit: the exclusive ones at first, whatever is free after a reconnect
        self.conn.send(PartitionRequest(self.partition, self.subpartition, self.receiver_id,
                                        self.credit.announced, self.next_seq, self.shared, self.end))

    # ------------------------------------------------------------ from the connection
    def on_message(self, msg: BufferResponse | ErrorResponse) -> None:
        if self.state != ChannelState.REQUESTED:
            return
        if isinstance(msg, ErrorResponse):
            self.fail(msg.message, code=msg.code)
            return
        if msg.seq != self.next_seq:
            what = "lost" if msg.seq > self.next_seq else "duplicated"
            self.fail(f"buffers {what} on the way from the service: buffer {msg.seq} of partition {self.partition} of "
                      f"exchange {self.gate.name!r} arrived where buffer {self.next_seq} was due")
            return
        self.next_seq += 1
        try:
            announcements = self.credit.on_buffer(msg.kind, msg.backlog)
        except Exception as exc:  # noqa: BLE001 - a credit violation is the sender's bug; fail the read
            self.fail(str(exc))
            return
        self.gate.announce(announcements)
        if msg.flags & FLAG_SHARED:
            try:
                msg = self._copy_shared(msg)
            except (ArenaError, ProtocolError) as exc:
                self.fail(f"cannot read a shared-memory buffer of partition {self.partition}: {exc} "
                          "(sharedMemory=false sends every buffer over the socket)")
                return
        if msg.kind == BufferKind.DATA:
            self.data_received += 1
            self.bytes_received += len(msg.payload)
            self.gate.deliver(self, msg)
        elif msg.kind == BufferKind.MARKER:  # recorded before the end of partition that follows it is queued
            self.markers.append(bytes(msg.payload))
        elif msg.kind == BufferKind.END_OF_PARTITION:
            # its counts queue behind the channel's buffers: the task thread checks them once it decoded those
            counts = END_COUNTS.unpack(msg.payload) if len(msg.payload) == END_COUNTS.size else None
            self.gate.deliver_end(self, counts)
            self.state = ChannelState.FINISHED
            self._detach()
            self.gate.announce(self.credit.close())
            self.gate.channel_finished(self)

    def _copy_shared(self, msg: BufferResponse) -> BufferResponse:
        """Copy the buffer out of the writer's slot, then tell the service the slot may be reused."""
        ref = SharedRef.unpack(msg.payload)
        payload = self.gate.arena_reader().copy_out(ref.path, ref.offset, ref.length, FRAME_POOL.take(ref.length))
        self.conn.send(SharedBuffersRead(self.receiver_id, 1))
        return dataclasses.replace(msg, flags=msg.flags & ~FLAG_SHARED, payload=payload)

    def _fail_over(self, why: str) -> bool:
        """Go on from the next replica at the sequence reached (no buffer lost or repeated); False: none left."""
        if not self.resumable or not self.replicas or self.state.done:
            return False
        where = self.replicas.pop(0)
        local = where.get("host_id") == self.gate.host_id and bool(where.get("unix"))
        self.failed_over.append(f"{self.address}: {why}")
        self._detach()
        self.address = where["unix"] if local else where.get("tcp", "")
        self.shared = self.shared and local  # shared-memory slots are readable on the replica's host only
        self.state = ChannelState.PENDING
        asyncio.ensure_future(self.request())
        return True

    def on_connection_lost(self, reason: str) -> None:
        if self.state == ChannelState.REQUESTED and self._fail_over(f"lost the connection: {reason}"):
            return
        if self.state == ChannelState.REQUESTED and self.resumable and self.reconnects < self.MAX_RECONNECTS:
            self.reconnects += 1
            self._detach()
            self.state = ChannelState.PENDING
            delay = 0.2 * self.reconnects
            asyncio.get_running_loop().call_later(delay, lambda: asyncio.ensure_future(self.request()))
            return
        if self.state.live:
            self.fail(f"lost the exchange service holding partition {self.partition} at {self.address}: {reason}"
                      f"{self._replicas_tried()}", code=ErrorCode.CONNECTION_LOST)

    def _replicas_tried(self) -> str:
        return f" (the read had gone on from the partition's replicas after: {'; '.join(self.failed_over)})" if self.failed_over else ""

    # ------------------------------------------------------------ from the gate
    def consumed(self, n: int = 1) -> None:
        """The reader finished with ``n`` data buffers of this channel: they become credit again, announced
        to the sender as one AddCredit per channel rather than one per buffer."""
        announcements: list[tuple[ChannelCredit, int]] = []
        for _ in range(n):
            announcements.extend(self.credit.on_consumed())
        self.gate.announce(announcements)

    def send_credit(self, n: int) -> None:
        if self.state == ChannelState.REQUESTED and self.conn is not None:
            self.conn.send(AddCredit(self.receiver_id, n))

    def fail(self, message: str, code: ErrorCode | str = ErrorCode.ERROR) -> None:
        """A failed channel cancels its request: the service drops its view (and the slots it pins)."""
        if self.state == ChannelState.REQUESTED and self.conn is not None:
            self.conn.send(CancelPartitionRequest(self.receiver_id))
        super().fail(message, code)

    def cancel(self) -> None:
        if self.state == ChannelState.REQUESTED and self.conn is not None:
            self.conn.send(CancelPartitionRequest(self.receiver_id))
        self.state = ChannelState.CANCELLED
        self._detach()
        self.gate.announce(self.credit.close())

    def _release(self) -> None:
        self._detach()

    def _detach(self) -> None:
        if self.conn is not None:
            self.conn.channels.pop(self.receiver_id, None)


class LocalInputChannel(InputChannel):
    locality = "local"

    def __init__(self, gate: Gate, producer: dict, subpartition: int, address: str,
                 end: int | None = None) -> None:
        super().__init__(gate, producer, subpartition, address, end)
        self.shared = gate.config.shared_memory and shared_arena.available()


class FileOpenError(Exception):
    """A local spill file cannot be read at all (its service is gone, the file or its index is unreadable)."""


class LocalFileInputChannel(Channel):
    """A finished re-readable partition on this host, read straight from its spill file.

    No service round trip and no credit: the reading task pulls buffers at its
    own pace, as slices of the file's read-only mapping (:class:`SpillData`,
    shared by this process's reads). The mapping keeps the data readable even
    if the partition is released meanwhile. The channel lets go of it when the
    task thread is done, or on ``cancel`` if the task thread never started on
    it (the lock decides which thread owns it).

    Opened by :meth:`request` on the IO thread (a gate with remote channels
    too), or by :meth:`open` on the task thread (a gate whose every producer is
    a local finished spill file: no IO thread at all).
    """

    locality = "local-file"

    def __init__(self, gate: Gate, producer: dict, subpartition: int, end: int | None = None,
                 index_path: str | None = None) -> None:
        super().__init__(gate, producer, subpartition, end)
        self.data_path: str = producer["spill"]
        self.index_path = index_path or index_path_of(self.data_path)
        self._data: SpillData | None = None
        self._entries: list[tuple[int, int, int, int, int]] = []
        self._lock = threading.Lock()
        self._reading = False  # the task thread owns the file from now on
        self.end_counts: tuple[int, int] | None = None  # summed over the range, read from the spill file
        self.mapped_bytes = 0

    def open(self) -> None:
        """Open the data file and look its range up in the (per-process cached) index; FileOpenError if not."""
        location = self.producer.get("location") or {}
        pid = location.get("pid")
        if isinstance(pid, int) and not self.gate.service_alive(pid):
            raise FileOpenError(f"lost the exchange service holding partition {self.partition} at "
                                f"{location.get('tcp')} (its process {pid} is gone); its spill files are no longer "
                                "served")
        try:
            data = open_spill_data(self.data_path, self.index_path)
            self._entries = data.entries(self.subpartition, self.end)
        except OSError as exc:
            raise FileOpenError(f"cannot read the spill file of partition {self.partition} of exchange "
                                f"{self.gate.name!r} ({self.data_path}): {exc}") from None
        self._data = data
        self.state = ChannelState.REQUESTED

    async def request(self) -> None:
        if self.state != ChannelState.PENDING:
            return
        try:
            self.open()
        except FileOpenError as exc:
            self.fail(str(exc))
            return
        with self._lock:
            if self.state != ChannelState.REQUESTED:  # cancelled meanwhile
                self._release()
                return
        self.gate.deliver_file(self)

    def payloads(self) -> Iterator[bytes | pa.Buffer]:
        """Runs on the task thread: the subpartition's data buffers, in sequence order.

        Each subpartition's end-of-partition entry points at its counts in the data file; they are summed into
        ``end_counts`` (left None for a file written before counts existed)."""
        ends: list[tuple[int, int]] = []
        legacy = False
        with self._lock:
            if self.state != ChannelState.REQUESTED:
                return
            self._reading = True
        data = self._data
        try:
            for _seq, offset, length, kind, _flags in self._entries:
                if self.state != ChannelState.REQUESTED:
                    return
                if kind == BufferKind.END_OF_PARTITION:
                    if length != END_COUNTS.size:
                        legacy = True
                        continue
                    ends.append(END_COUNTS.unpack(data.read(offset, length)))
                    continue
                if kind == BufferKind.MARKER:
                    self.markers.append(bytes(data.read(offset, length)))
                    continue
                if kind != BufferKind.DATA:
                    continue
                payload = data.read(offset, length)
                self.data_received += 1
                self.bytes_received += length
                self.mapped_bytes += length
                yield payload
            wanted = (self.end or self.subpartition + 1) - self.subpartition
            if not legacy:
                if len(ends) != wanted:
                    raise OSError(f"the index of {self.data_path} lists {len(ends)} ends of subpartition for "
                                  f"{wanted} subpartitions")
                rows = [r for _, r in ends]
                self.end_counts = (sum(b for b, _ in ends), -1 if min(rows) < 0 else sum(rows))
            self.state = ChannelState.FINISHED
        finally:
            self._release()

    def consumed(self, n: int = 1) -> None:
        pass

    def send_credit(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        with self._lock:
            if self.state.live:
                self.state = ChannelState.CANCELLED
            if not self._reading:  # the task thread never started on it: nobody else will close the file
                self._release()

    def close(self) -> None:
        """Task thread, fast path (no other thread knows this channel): done with it, whatever its state."""
        if self.state.live:
            self.state = ChannelState.CANCELLED
        self._release()

    def _release(self) -> None:
        self._data = None  # the mapping stays in the process's cache (and with any batch still using it)


class RemoteInputChannel(InputChannel):
    locality = "remote"


def index_path_of(data_path: str) -> str:
    """The index file next to a spill data file (``x.data`` -> ``x.index``; plain string work, per producer)."""
    stem = data_path[:-5] if data_path.endswith(".data") else data_path.rsplit(".", 1)[0] if \
        "." in data_path.rsplit("/", 1)[-1] else data_path
    return stem + ".index"


def make_channel(gate: Gate, producer: dict, subpartition: int,
                 end: int | None = None) -> InputChannel | LocalFileInputChannel:
    """The channel for one producer: its spill file, its service's Unix socket, or TCP.

    ``end``: read subpartitions [subpartition, end) of this producer through the one channel."""
    location = producer.get("location") or {}
    local = location.get("host_id") == gate.host_id
    spill = producer.get("spill")
    if end is not None and end == subpartition + 1:
        end = None
    pid = location.get("pid")
    if local and spill and producer.get("state") == PartitionState.FINISHED and not (
            producer.get("replicas") and isinstance(pid, int) and not gate.service_alive(pid)):
        # (a replicated partition whose service here is gone is read from a replica, through a service channel)
        index = index_path_of(spill)
        if OPEN_FILES.cached(spill) or os.path.exists(index):  # no index (yet): served by its service
            return LocalFileInputChannel(gate, producer, subpartition, end, index)
    if local and location.get("unix"):
        return LocalInputChannel(gate, producer, subpartition, location["unix"], end)
    return RemoteInputChannel(gate, producer, subpartition, location.get("tcp", ""), end)
