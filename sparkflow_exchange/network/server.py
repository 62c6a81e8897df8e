"""The server side of a connection: asyncio moves bytes, the sans-IO pieces decide.

One ``ServerConnection`` per client connection (Flink's
PartitionRequestServerHandler + PartitionRequestQueue). It authenticates the
client, serves partition requests from a :class:`PartitionRequestQueue`
(writing while the transport is below its high-water mark and resuming at the
low one), takes producers' pushes under credit, and answers RPCs. Anything
malformed gets an :class:`ErrorResponse` naming the problem and, when the
stream can no longer be trusted, the connection is closed.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import ErrorCode, ExchangeError, code_of
from ..exhaustion import explain, is_exhaustion
from ..partition.range_view import RangeView
from ..partition.shared_arena import ArenaError, SharedArena
from ..partition.subpartition import ERROR_KIND
from . import auth
from .admission import peer_of
from .blocking_client import tune_socket
from .credit import PartitionRequestQueue, ViewFailed
from .rpc import check_args
from .protocol import (
    FLAG_SHARED,
    AddCredit,
    BufferKind,
    BufferResponse,
    CancelPartitionRequest,
    CloseRequest,
    ErrorResponse,
    FailPartition,
    FinishPartition,
    PREAUTH_MAX_FRAME,
    FrameDecoder,
    Hello,
    PartitionFinished,
    PartitionRegistered,
    PartitionReleased,
    PartitionRequest,
    ProducerCredit,
    ProtocolError,
    PushBuffer,
    PushRegion,
    PushSharedBuffer,
    PushSharedRegion,
    RegisterPartition,
    ResumeConsumption,
    RpcRequest,
    RpcResponse,
    ServerHello,
    SharedBuffersRead,
    SharedRef,
    SlotsFreed,
    Welcome,
    encode,
)

if TYPE_CHECKING:
    from ..config import ExchangeConfig
    from ..partition.result_partition import ResultPartition

log = logging.getLogger(__name__)


class ConnectionHost(Protocol):
    """What a :class:`ServerConnection` needs of the service it serves (``service/exchange_service.py``
    implements it): the network room never imports the service room."""

    config: "ExchangeConfig"
    service_id: str
    host_id: str
    secret: str | None
    credentials: dict[str, str]  # name -> secret of every credential it accepts (empty: no authentication)
    traffic: dict[str, int]  # bytes served, by path
    partitions: dict[str, "ResultPartition"]

    def admit(self, conn: "ServerConnection") -> str | None:
        """Take a new connection, or say why not."""

    def authenticated(self, conn: "ServerConnection") -> None: ...

    def discharge(self, conn: "ServerConnection") -> None: ...

    def on_connection_closed(self, conn: "ServerConnection") -> None: ...

    def register_partition(self, msg: RegisterPartition) -> "ResultPartition": ...

    def producer_lost(self, part: "ResultPartition", reason: str) -> None: ...

    async def rpc(self, conn: "ServerConnection", method: str, args: dict) -> Any: ...

HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1 * 1024 * 1024
MAX_GRANT = 64  # credit granted to a BLOCKING writer at a time


class _Producer:
    def __init__(self, partition: "ResultPartition", arena: SharedArena | None = None) -> None:
        self.partition = partition
        self.arena = arena  # the writer's shared-memory slots, on the same host
        self.slots_in_use: set[int] = set()
        self.slots_freed: list[int] = []  # announced to the writer once the current callback is done
        self.grant_scheduled = False
        self.outstanding = 0  # credit granted and not used yet
        self.started = time.monotonic()
        self.blocked_since: float | None = None  # the writer has no credit since then
        self.blocked_seconds = 0.0
        self.release_code = ErrorCode.RELEASED  # what its writer was told when the partition was released

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


class ServerConnection(asyncio.BufferedProtocol):
    def __init__(self, service: ConnectionHost, transport_kind: str) -> None:
        self.service = service
        self.transport_kind = transport_kind  # "tcp" or "unix"
        # a stranger may send only small frames until it proved the secret: it costs us a few KiB
        self.decoder = FrameDecoder(PREAUTH_MAX_FRAME, staging=PREAUTH_MAX_FRAME)
        self.queue = PartitionRequestQueue()
        self.transport: asyncio.Transport | None = None
        self.nonce = auth.new_nonce()
        self.authenticated = False
        self.identity = ""  # the credential the client proved (auth.OPERATOR: the service's own secret)
        self.client_id = "?"
        self.client_host = ""
        self.paused = False
        self.pump_scheduled = False
        self.closed = False
        self.producers: dict[int, _Producer] = {}  # partitions this connection is writing, by handle
        self._handles = itertools.count(1)
        self.subscriptions: dict[str, Callable[[], None]] = {}  # topic -> unsubscribe from the coordinator
        self.bytes_sent = 0
        self.bytes_received = 0
        self.channel_bytes: dict[int, int] = {}
        self.held: dict[int, deque] = {}  # receiver -> (partition, buffer) sent by reference, not yet copied
        self.locality = "remote"
        self.peer = ""
        self.peer_key = ""  # what it counts against until it authenticates: an address (TCP) or a uid (Unix)
        self.trusted = False  # this service's own user on the Unix socket (SO_PEERCRED)
        self._hello_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        tune_socket(transport.get_extra_info("socket"))
        self.peer = str(transport.get_extra_info("peername") or "unix")
        self.peer_key, self.trusted = peer_of(transport.get_extra_info("socket"), self.transport_kind,
                                              transport.get_extra_info("peername"))
        refusal = self.service.admit(self)
        if refusal:
            self.fatal(refusal, code=ErrorCode.TOO_MANY_CONNECTIONS)
            return
        self.send(ServerHello(self.nonce, self.service.service_id, self.service.host_id))
        self._hello_timer = asyncio.get_running_loop().call_later(self.service.config.hello_timeout, self._no_hello)

    def _no_hello(self) -> None:
        if not self.authenticated and not self.closed:
            self.fatal(f"no Hello within helloTimeout={self.service.config.hello_timeout:g} s of connecting",
                       code=ErrorCode.AUTH)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.service.discharge(self)
        if self.decoder.pending:
            log.info("client %s vanished mid-frame (%d bytes of an incomplete frame dropped)", self.peer, self.decoder.pending)
        for rid, view in self.queue.views().items():
            view.release()
        for rid in list(self.held):
            self._unpin(rid, None)
        for handle, producer in list(self.producers.items()):
            part = producer.partition
            if not part.finished and not part.failure:
                self.service.producer_lost(part, f"connection of its writer ({self.client_id}) was lost before finish")
            self._detach(handle)
        self.service.on_connection_closed(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.schedule_pump()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        """The kernel wrote ``nbytes`` straight into the decoder (large payloads land in place)."""
        self.bytes_received += nbytes
        try:
            messages = self.decoder.buffer_updated(nbytes)
        except ProtocolError as exc:
            self.fatal(f"protocol error: {exc}", code=ErrorCode.PROTOCOL)
            return
        for msg in messages:
            if self.closed:
                return
            try:
                self.handle(msg)
            except ProtocolError as exc:
                self.fatal(f"protocol error: {exc}", code=ErrorCode.PROTOCOL)
                return
            except (RuntimeError, ValueError, OSError, TypeError, KeyError) as exc:
                self.send(ErrorResponse(f"{type(msg).__name__} failed: {exc}", None, False,
                                        code_of(exc, ErrorCode.FAILED)))

    def send(self, msg: Any) -> None:
        if self.closed or self.transport is None:
            return
        pieces = encode(msg)
        for piece in pieces:  # not writelines: in 3.11 it joins, copying every payload
            self.transport.write(piece)
        self.bytes_sent += sum(len(p) for p in pieces)

    def fatal(self, message: str, code: ErrorCode = ErrorCode.ERROR) -> None:
        log.warning("closing connection from %s: %s", self.peer, message)
        self.send(ErrorResponse(message, None, True, code))
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------ dispatch
    def handle(self, msg: Any) -> None:
        if not self.authenticated:
            if not isinstance(msg, Hello):
                raise ProtocolError(f"expected Hello as the first message, got {type(msg).__name__}")
            who = auth.identify(self.service.credentials, self.nonce, msg.proof)
            if isinstance(who, str):
                self.fatal(who, code=ErrorCode.AUTH)
                return
            self.identity = who.name
            self.authenticated = True
            self.service.authenticated(self)
            self._hello_timer.cancel()
            self.decoder.raise_limits(self.service.config.max_frame_size)
            self.client_id = msg.client_id
            self.client_host = msg.host_id
            self.locality = "local" if msg.host_id == self.service.host_id else "remote"
            self.send(Welcome(self.service.service_id, self.service.host_id,
                              auth.prove_service(who.secret, msg.nonce, self.nonce)))
            return
        if isinstance(msg, PushBuffer):
            self.on_push(msg)
        elif isinstance(msg, PushSharedBuffer):
            self.on_push_shared(msg)
        elif isinstance(msg, PushRegion):
            self.on_push_region(msg)
        elif isinstance(msg, PushSharedRegion):
            self.on_push_shared_region(msg)
        elif isinstance(msg, AddCredit):
            self.queue.add_credit(msg.receiver_id, msg.credit)
            self.schedule_pump()
        elif isinstance(msg, SharedBuffersRead):
            self._unpin(msg.receiver_id, msg.count)
        elif isinstance(msg, PartitionRequest):
            self.on_partition_request(msg)
        elif isinstance(msg, (CancelPartitionRequest, ResumeConsumption)):
            if isinstance(msg, CancelPartitionRequest):
                view = self.queue.remove(msg.receiver_id)
                if view is not None:
                    view.release()
                self._unpin(msg.receiver_id, None)
            else:
                self.queue.notify_available(msg.receiver_id)
                self.schedule_pump()
        elif isinstance(msg, RegisterPartition):
            self.on_register(msg)
        elif isinstance(msg, FinishPartition):
            producer = self._producer(msg.handle)
            producer.set_blocked(False)
            if producer.partition.released:  # told already (maybe crossing this finish): told again
                self._tell_released(msg.handle, producer.partition.release_reason, producer.release_code)
                return
            lost = producer.partition.count_mismatch(msg.counts)
            if lost is not None:  # the partition fails (its readers hear so); the writer's task fails with this
                self.service.producer_lost(producer.partition, lost)
                self.send(ErrorResponse(lost, None, False, ErrorCode.ROWS_LOST))
                return
            producer.partition.finish(msg.counts)
            stats = producer.partition.stats()
            # bytes per subpartition: the coordinator sums them at commit to size coalesced reads
            stats["subpartition_bytes"] = [sub.bytes_added for sub in producer.partition.subpartitions]
            self.send(PartitionFinished(msg.handle, stats))
            self._detach(msg.handle)  # done with it: the connection may carry the writer's next partition
        elif isinstance(msg, FailPartition):
            producer = self._producer(msg.handle)
            self.service.producer_lost(producer.partition, msg.reason)
        elif isinstance(msg, RpcRequest):
            asyncio.ensure_future(self.on_rpc(msg))
        elif isinstance(msg, CloseRequest):
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        else:
            raise ProtocolError(f"unexpected {type(msg).__name__} from a client")

    def _detach(self, handle: int) -> None:
        """Forget a partition this connection wrote. It outlives the connection's interest: it must not keep the
        connection (and through it the writer's arena mapping, bufferSize x buffersPerPartition of shared
        memory) alive until it is dropped."""
        producer = self.producers.pop(handle, None)
        if producer is None:
            return
        producer.partition.on_slots_freed = lambda arena_slot: None
        producer.partition.memory.set_on_credit(lambda: None)
        producer.partition.on_released = None
        producer.arena = None

    def _on_released(self, handle: int, reason: str, code: str) -> None:
        """The partition this connection writes was released: its writer hears it now (credit never comes)."""
        producer = self.producers.get(handle)
        if producer is not None:
            producer.release_code = code
            producer.set_blocked(False)
            self._tell_released(handle, reason, code)

    def _tell_released(self, handle: int, reason: str, code: str) -> None:
        part = self.producers[handle].partition
        self.send(PartitionReleased(handle, f"partition {part.pid} of exchange {part.exchange!r} was released "
                                            f"while it was being written: {reason or 'released'}", code))

    def _producer(self, handle: int) -> _Producer:
        producer = self.producers.get(handle)
        if producer is None:
            raise ProtocolError(f"unknown partition handle {handle} on this connection")
        return producer

    # ------------------------------------------------------------ consumer side
    def on_partition_request(self, msg: PartitionRequest) -> None:
        rid = msg.receiver_id
        part = self.service.partitions.get(msg.partition)
        if part is None:
            self.send(ErrorResponse(f"unknown partition {msg.partition!r} on service {self.service.service_id}", rid, False,
                                    ErrorCode.UNKNOWN_PARTITION))
            return
        if rid in self.queue:
            raise ProtocolError(f"receiver id {rid} is already in use on this connection")
        try:
            listener = lambda: self.on_view_available(rid)  # noqa: E731
            if msg.subpartition_end is None:
                view = part.create_view(msg.subpartition, msg.resume_from, listener)
            else:  # a coalesced read: subpartitions [subpartition, subpartition_end) in order, one channel
                view = RangeView(part, msg.subpartition, msg.subpartition_end, msg.resume_from, listener)
        except (IndexError, ValueError, RuntimeError) as exc:
            self.send(ErrorResponse(str(exc), rid, False, ErrorCode.BAD_REQUEST))
            return
        view.shared = msg.shared and self.transport_kind == "unix" and self.service.config.shared_memory
        self.queue.add_view(rid, view, msg.initial_credit)
        self.schedule_pump()

    def _unpin(self, receiver_id: int, count: int | None) -> None:
        """The reader copied ``count`` more shared buffers (None: it will copy no more of them)."""
        held = self.held.get(receiver_id)
        if count is not None and (held is None or count > len(held) or count < 1):
            raise ProtocolError(f"SharedBuffersRead({count}) for receiver {receiver_id}, which holds "
                                f"{len(held) if held else 0} shared buffers")
        if held is None:
            return
        for _ in range(len(held) if count is None else count):
            part, buf = held.popleft()
            part.memory.unpin(buf)
        if not held:
            del self.held[receiver_id]

    def on_view_available(self, receiver_id: int) -> None:
        self.queue.notify_available(receiver_id)
        self.schedule_pump()

    def schedule_pump(self) -> None:
        if not self.pump_scheduled and not self.closed:
            self.pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        """Write available buffers until the transport reaches its high-water mark. A view that fails
        (its spill file gone or truncated...) fails its channel only, with an ErrorResponse saying why."""
        self.pump_scheduled = False
        while not self.paused and not self.closed:
            try:
                polled = self.queue.poll()
            except ViewFailed as exc:
                self.fail_channel(exc.receiver_id, exc.cause)
                continue
            if polled is None:
                return
            try:
                self._write_item(*polled)
            except Exception as exc:  # noqa: BLE001 - this channel fails, the connection and the others go on
                if not is_exhaustion(exc):
                    log.exception("sending to receiver %s failed", polled[0])
                self.fail_channel(polled[0], exc)

    def fail_channel(self, receiver_id: int, exc: BaseException) -> None:
        """Drop one channel's view and tell its reader which partition failed and why (non-fatal)."""
        view = self.queue.remove(receiver_id)
        where = "a partition"
        if view is not None:
            sub = view.sub
            where = (f"subpartition {sub.index} of partition {sub.partition.pid} "
                     f"(exchange {sub.partition.exchange!r})")
            view.release()
        # shared buffers it holds stay pinned until the reader says it is done (its CancelPartitionRequest
        # comes after it handled every earlier buffer) or goes: a slot is never refilled under a copy
        message = explain(exc, f"reading {where} failed on service {self.service.service_id}")
        log.warning("%s", message)
        self.send(ErrorResponse(message, receiver_id, False, code_of(exc, ErrorCode.READ_FAILED)))

    def _write_item(self, rid: int, item, seq: int, backlog: int) -> None:
        if item.kind == ERROR_KIND:
            view = self.queue.remove(rid)
            released = view is not None and view.sub.partition.released and view.sub.partition.failure is None
            if view is not None:
                view.release()
            self.send(ErrorResponse(bytes(item.payload).decode(), rid, False,
                                    ErrorCode.RELEASED if released else ErrorCode.PRODUCER_FAILED))
            return
        if item.shared is not None:  # a reader on this host copies it out of the writer's slot itself
            _part, buf = item.shared
            ref = SharedRef(str(buf.arena.path), buf.arena_offset, buf.size).pack()
            self.send(BufferResponse(rid, seq, backlog, item.kind, item.flags | FLAG_SHARED, ref))
            self.held.setdefault(rid, deque()).append(item.shared)
            self.service.traffic["local_shared"] += buf.size
        else:
            self.send(BufferResponse(rid, seq, backlog, item.kind, item.flags, item.payload))
        self.channel_bytes[rid] = self.channel_bytes.get(rid, 0) + len(item.payload)
        self.service.traffic[self.locality] += len(item.payload)
        if item.kind == BufferKind.END_OF_PARTITION:
            view = self.queue.remove(rid)
            if view is not None:
                view.release()

    # ------------------------------------------------------------ producer side
    def on_register(self, msg: RegisterPartition) -> None:
        try:
            part = self.service.register_partition(msg)
        except (ValueError, RuntimeError) as exc:
            self.send(ErrorResponse(str(exc), None, False, ErrorCode.REGISTER_FAILED))
            return
        except (OSError, MemoryError) as exc:  # out of fds or disk: this registration fails, the rest go on
            self.send(ErrorResponse(explain(exc, f"registering partition {msg.partition!r}"), None, False,
                                    code_of(exc, ErrorCode.REGISTER_FAILED)))
            return
        handle = next(self._handles)
        arena = self._attach_arena(msg, part)
        producer = _Producer(part, arena)
        self.producers[handle] = producer
        part.on_slots_freed = lambda arena_slot: self.slot_freed(handle, arena_slot)
        part.memory.set_on_credit(lambda: self.grant(handle))
        part.on_released = lambda reason, code: self._on_released(handle, reason, code)
        self.send(PartitionRegistered(part.pid, handle, 0, part.memory.buffer_size, arena.slots if arena else 0))
        self.grant(handle)

    def _attach_arena(self, msg: RegisterPartition, part: "ResultPartition") -> SharedArena | None:
        """Map the writer's arena when it is on this host (Unix socket) and the partition has a pool."""
        if not msg.shm_path or self.transport_kind != "unix" or part.pool is None \
                or not self.service.config.shared_memory:
            return None
        try:
            arena = SharedArena.attach(msg.shm_path, min(msg.shm_slots, part.memory.max_slots), msg.shm_slot_size)
        except ArenaError as exc:
            log.info("partition %s pushes over the socket: %s", part.pid, exc)
            return None
        part.arenas.add(arena)  # the partition gives it back once it needs it no more
        return arena

    def slot_freed(self, handle: int, arena_slot: int) -> None:
        """A pool slot is free. An arena slot is announced only after this callback: the payload
        may be on its way into a transport's write right now, and the writer must not refill it before."""
        producer = self.producers.get(handle)
        if producer is None or producer.arena is None:
            self.grant(handle)
            return
        if arena_slot >= 0:
            producer.slots_in_use.discard(arena_slot)
            producer.slots_freed.append(arena_slot)
        if not producer.grant_scheduled:
            producer.grant_scheduled = True
            asyncio.get_running_loop().call_soon(self._announce_slots, handle)

    def _announce_slots(self, handle: int) -> None:
        producer = self.producers.get(handle)
        if producer is None:
            return
        producer.grant_scheduled = False
        part = producer.partition
        # a finished writer fills no slot any more (a spilling partition frees them all at finish)
        if producer.slots_freed and not self.closed and not (part.finished or part.failure or part.released):
            self.send(SlotsFreed(handle, tuple(producer.slots_freed)))
        producer.slots_freed.clear()
        self.grant(handle)

    def grant(self, handle: int) -> None:
        """Credit as the partition's memory allows (``partition_memory.py``), and, with an arena, no more
        than the writer has free slots for: a slot whose SlotsFreed has not gone out yet is not free."""
        producer = self.producers.get(handle)
        if producer is None or self.closed:
            return
        part = producer.partition
        if part.finished or part.failure or part.released:
            return
        pending = len(producer.slots_freed)
        cap = MAX_GRANT
        if producer.arena is not None:
            cap = min(cap, producer.arena.slots - len(producer.slots_in_use) - pending)
        new = part.memory.grant(producer.outstanding, cap, pending)
        if new > 0:
            producer.outstanding += new
            self.send(ProducerCredit(handle, new))
        producer.set_blocked(producer.outstanding <= 0)

    def on_push(self, msg: PushBuffer) -> None:
        self._store(msg, self._producer(msg.handle), msg.payload)

    def _arena_slot(self, msg: PushSharedBuffer | PushSharedRegion, producer: _Producer) -> SharedArena:
        """The writer's arena, after checking that ``msg.slot`` is one of its slots and not in use."""
        arena = producer.arena
        name = type(msg).__name__
        pid = producer.partition.pid
        if arena is None:
            raise ProtocolError(f"{name} for partition {pid}, which has no shared-memory arena")
        if not 0 <= msg.slot < arena.slots or msg.slot in producer.slots_in_use:
            state = "in use" if msg.slot in producer.slots_in_use else f"outside 0..{arena.slots - 1}"
            raise ProtocolError(f"{name} for partition {pid}: arena slot {msg.slot} is {state}")
        if msg.kind != BufferKind.DATA:
            raise ProtocolError(f"{name} for partition {pid}: kind {msg.kind} is not data")
        return arena

    def on_push_shared(self, msg: PushSharedBuffer) -> None:
        producer = self._producer(msg.handle)
        arena = self._arena_slot(msg, producer)
        if msg.offset + msg.length > arena.slot_size:
            raise ProtocolError(f"PushSharedBuffer for partition {producer.partition.pid}: {msg.length} bytes at "
                                f"offset {msg.offset} do not fit a slot of {arena.slot_size} bytes")
        self._store(msg, producer, arena.slot(msg.slot)[msg.offset:msg.offset + msg.length], msg.slot,
                    msg.slot * arena.slot_size + msg.offset)

    def on_push_region(self, msg: PushRegion) -> None:
        producer = self._producer(msg.handle)
        if msg.kind != BufferKind.DATA:
            raise ProtocolError(f"PushRegion for partition {producer.partition.pid}: kind {msg.kind} is not data")
        self._store(msg, producer, msg.payload)

    def on_push_shared_region(self, msg: PushSharedRegion) -> None:
        producer = self._producer(msg.handle)
        arena = self._arena_slot(msg, producer)
        end = max(offset + length for _sub, offset, length in msg.pieces)
        if end > arena.slot_size:
            raise ProtocolError(f"PushSharedRegion for partition {producer.partition.pid}: a piece ends at byte "
                                f"{end}, outside the slot of {arena.slot_size} bytes")
        self._store(msg, producer, arena.slot(msg.slot)[:end], msg.slot, msg.slot * arena.slot_size)

    def _store(self, msg, producer: _Producer, payload, arena_slot: int = -1, arena_offset: int = 0) -> None:
        """Spend one credit on a pushed buffer or region and add it to the partition; a refusal is told
        to the writer (the connection goes on)."""
        part = producer.partition
        if producer.outstanding <= 0:
            raise ProtocolError(f"{type(msg).__name__} without credit for partition {part.pid}")
        producer.outstanding -= 1
        if part.released:  # sent before its writer heard of the release: dropped, the writer was told why
            return
        arena = producer.arena if arena_slot >= 0 else None
        if arena is not None:
            producer.slots_in_use.add(arena_slot)
        try:
            if isinstance(msg, (PushRegion, PushSharedRegion)):
                part.add_region(msg.kind, msg.flags, msg.pieces, payload, arena_slot, arena, arena_offset)
            else:
                part.add(msg.subpartition, msg.kind, msg.flags, payload, arena_slot, arena, arena_offset)
        except (RuntimeError, OSError, MemoryError) as exc:
            part.memory.forfeit()
            if arena is not None and arena_slot in producer.slots_in_use:
                self.slot_freed(msg.handle, arena_slot)
            if isinstance(exc, RuntimeError):
                self.send(ErrorResponse(f"{type(msg).__name__} refused: {exc}", None, False, code_of(exc, ErrorCode.PUSH_FAILED)))
            else:  # a full disk, say: the partition cannot be whole any more, its writer and readers hear why
                reason = explain(exc, f"storing a buffer of partition {part.pid}")
                self.service.producer_lost(part, reason)
                self.send(ErrorResponse(reason, None, False, code_of(exc, ErrorCode.PUSH_FAILED)))
        self.grant(msg.handle)

    # ------------------------------------------------------------ rpc
    async def on_rpc(self, msg: RpcRequest) -> None:
        try:
            check_args(msg.method, msg.args)
            result = await self.service.rpc(self, msg.method, msg.args)
            self.send(RpcResponse(msg.call_id, result))
        except ExchangeError as exc:
            self.send(RpcResponse(msg.call_id, None, str(exc), exc.code))
        except (TypeError, KeyError, ValueError) as exc:
            self.send(RpcResponse(msg.call_id, None, f"bad {msg.method!r} request: {exc}", ErrorCode.BAD_REQUEST))
        except (OSError, MemoryError) as exc:  # out of fds, disk or memory: this request fails, the rest go on
            message = explain(exc, f"{msg.method} on service {self.service.service_id}")
            log.warning("%s", message)
            self.send(RpcResponse(msg.call_id, None, message, code_of(exc, ErrorCode.INTERNAL)))
        except Exception as exc:  # noqa: BLE001 - the client must hear about it, the service goes on
            if is_exhaustion(exc):  # out of fds, disk or memory: this call fails, saying which
                self.send(RpcResponse(msg.call_id, None, explain(exc, f"{msg.method} failed"), "exhausted"))
                return
            log.exception("rpc %s failed", msg.method)
            self.send(RpcResponse(msg.call_id, None, f"{msg.method} failed: {exc}", ErrorCode.INTERNAL))
