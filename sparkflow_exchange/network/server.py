"""The server side of a connection: asyncio moves bytes, the sans-IO pieces decide.

One ``ServerConnection`` per client connection (Flink's PartitionRequestServerHandler). It feeds
received bytes to a :class:`FrameDecoder`, checks each message against the connection's state
(``connection.py``: the handshake and the table of what is legal when), and hands it to the
sans-IO side it belongs to: readers' channels (``consumers.py``, with ``credit.py``'s queue),
writers' partitions (``producers.py``), or the service's RPCs (checked against ``rpc.py``'s table).
It writes while less than its high-water mark waits to be sent and resumes at the low one: on a plain
socket through its own :class:`~.socket_writer.SocketWriter` (no copy of what the socket did not take,
spilled buffers sent from their file by ``sendfile``), over TLS through the transport. Anything
malformed gets an :class:`ErrorResponse` naming the problem and, when the stream can no longer be
trusted, the connection is closed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import ErrorCode, ExchangeError, code_of
from ..exhaustion import explain
from ..partition.spill import FileSpan
from .admission import peer_of
from .auth import may_read
from .blocking_client import tune_socket
from .connection import AuthRefused, ConnState, ServerHandshake
from .consumers import Consumers
from .producers import Producers
from .protocol import (
    PREAUTH_MAX_FRAME,
    AddCredit,
    BufferResponse,
    CancelPartitionRequest,
    CloseRequest,
    ErrorResponse,
    FailPartition,
    FinishPartition,
    FrameDecoder,
    Hello,
    Message,
    PartitionRequest,
    ProtocolError,
    PushBuffer,
    PushRegion,
    PushSharedBuffer,
    PushSharedRegion,
    RegisterPartition,
    ResumeConsumption,
    RpcRequest,
    RpcResponse,
    SharedBuffersRead,
    encode,
)
from .rpc import MAX_REASON_LENGTH, check_args
from .socket_writer import SocketWriter

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
    credentials: dict[str, str]  # name -> secret of every credential it accepts (empty: no authentication)
    traffic: dict[str, int]  # bytes served, by path
    partitions: dict[str, "ResultPartition"]

    def admit(self, conn: "ServerConnection") -> str | None:
        """Take a new connection, or say why not."""

    def authenticated(self, conn: "ServerConnection") -> str | None:
        """``conn`` proved its credential; why it is refused (its credential's connections cap), or None."""

    def discharge(self, conn: "ServerConnection") -> None: ...

    def on_connection_closed(self, conn: "ServerConnection") -> None: ...

    def register_partition(self, msg: RegisterPartition, owner: str) -> "ResultPartition": ...

    def producer_lost(self, part: "ResultPartition", reason: str) -> None: ...

    async def rpc(self, conn: "ServerConnection", method: str, args: dict) -> Any: ...


HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1 * 1024 * 1024
# what a connection may leave unread beyond its data's high-water mark before it is closed: notifications (the
# coordinator's events) are sent whether it reads or not, and a subscriber that never reads must not hold them
NOTIFY_BACKLOG = 1024 * 1024


class ServerConnection(asyncio.BufferedProtocol):
    def __init__(self, service: ConnectionHost, transport_kind: str) -> None:
        self.service = service
        self.transport_kind = transport_kind  # "tcp" or "unix"
        self.protocol = ServerHandshake(service.credentials, service.service_id, service.host_id)
        # a stranger may send only small frames until it proved the secret: it costs us a few KiB
        self.decoder = FrameDecoder(PREAUTH_MAX_FRAME, staging=PREAUTH_MAX_FRAME)
        self.consumers = Consumers(self.send, service.traffic, service.service_id)
        self.producers = Producers(self.send, self._defer, service.producer_lost)
        self.transport: asyncio.Transport | None = None
        self.writer: SocketWriter | None = None  # a plain socket's writes (None: through the transport, TLS)
        self.authenticated = False
        self.identity = ""  # the credential the client proved (auth.OPERATOR: the service's own secret)
        self.client_id = "?"
        self.client_host = ""
        self.peer = ""
        self.peer_key = ""  # what it counts against until it authenticates: an address (TCP) or a uid (Unix)
        self.trusted = False  # this service's own user on the Unix socket (SO_PEERCRED)
        self.paused = False
        self.pump_scheduled = False
        self.subscriptions: dict[str, Callable[[], None]] = {}  # topic -> unsubscribe from the coordinator
        self.bytes_sent = 0
        self.bytes_received = 0
        self._hello_timer: asyncio.TimerHandle | None = None

    # what the service's status shows
    queue = property(lambda self: self.consumers.queue)
    channel_bytes = property(lambda self: self.consumers.channel_bytes)
    locality = property(lambda self: self.consumers.locality)

    @property
    def closed(self) -> bool:
        return self.protocol.state is ConnState.CLOSED

    # ------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        sock = transport.get_extra_info("socket")
        tune_socket(sock)
        loop = asyncio.get_running_loop()
        if sock is not None and transport.get_extra_info("sslcontext") is None and SocketWriter.usable(loop):
            self.writer = SocketWriter(loop, sock.fileno(), HIGH_WATER, LOW_WATER, self.pause_writing,
                                       self.resume_writing, self._write_failed)
        self.peer = str(transport.get_extra_info("peername") or "unix")
        self.peer_key, self.trusted = peer_of(transport.get_extra_info("socket"), self.transport_kind,
                                              transport.get_extra_info("peername"))
        refusal = self.service.admit(self)
        if refusal:
            self.fatal(refusal, code=ErrorCode.TOO_MANY_CONNECTIONS)
            return
        self.send(self.protocol.greeting())
        self._hello_timer = asyncio.get_running_loop().call_later(self.service.config.hello_timeout, self._no_hello)

    def _no_hello(self) -> None:
        if not self.authenticated and not self.closed:
            self.fatal(f"no Hello within helloTimeout={self.service.config.hello_timeout:g} s of connecting",
                       code=ErrorCode.AUTH)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.close()
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self.service.discharge(self)
        if self.decoder.pending:
            log.info("client %s vanished mid-frame (%d bytes of an incomplete frame dropped)", self.peer, self.decoder.pending)
        if self.writer is not None:
            self.writer.abort()
        self.consumers.release_all()
        self.producers.connection_lost(self.client_id)
        self.service.on_connection_closed(self)
        # both sides and the socket writer hold this connection's bound methods: cut those cycles, so a closed
        # connection (and its decoder's staging area) is freed by reference counting at once, not by the
        # service's rare cyclic collections (service/main.py raises their threshold)
        self.consumers.send = self.producers.send = _closed_send
        self.producers.defer = _closed_defer
        if self.writer is not None:  # aborted above: it sends nothing more, so it pauses, resumes and fails no one
            self.writer.on_pause = self.writer.on_resume = _closed_flow
            self.writer.on_error = _closed_error

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

    def send(self, msg: Message) -> None:
        pieces = encode(msg)
        if self.closed or self.transport is None:
            _close_spans(pieces)
            return
        self.bytes_sent += sum(len(p) for p in pieces)
        if self.writer is not None:
            self.writer.write(pieces)
            return
        for piece in pieces:  # not writelines: in 3.11 it joins, copying every payload
            self.transport.write(piece)

    @property
    def unsent(self) -> int:
        """Bytes queued to this connection that its socket has not taken yet."""
        if self.writer is not None:
            return self.writer.buffered
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def notify(self, msg: Message) -> None:
        """Send a notification, unless the client leaves what it was sent unread: then it is closed (it hears
        why), rather than hold the service's memory for every later event."""
        if self.closed:
            return
        if self.unsent > HIGH_WATER + NOTIFY_BACKLOG:
            self.fatal(f"the connection left {self.unsent} bytes unread while subscribed to exchange events (at "
                       f"most {HIGH_WATER + NOTIFY_BACKLOG} may wait): a subscriber must read its notifications",
                       code=ErrorCode.LIMIT)
            if self.transport is not None:
                self.transport.abort()  # it does not read: what is queued is dropped, not sent
            return
        self.send(msg)

    def _write_failed(self, exc: BaseException) -> None:
        """The socket or a spill file failed mid-write: part of a frame may be out, so the connection ends (a
        reader resumes on a new one and is told what is wrong with the file, if anything)."""
        if isinstance(exc, (ConnectionError, BrokenPipeError)):
            log.info("connection from %s lost while writing: %s", self.peer, exc)
        else:
            log.warning("closing connection from %s: writing to it failed: %s", self.peer, exc)
        self.protocol.close()
        if self.transport is not None:
            self.transport.abort()

    @property
    def file_bytes_sent(self) -> int:
        """Bytes this connection sent straight from spill files (``sendfile``)."""
        return self.writer.file_bytes if self.writer is not None else 0

    def fatal(self, message: str, code: ErrorCode = ErrorCode.ERROR) -> None:
        log.warning("closing connection from %s: %s", self.peer, message)
        self.send(ErrorResponse(message, None, True, code))
        self.close()

    def close(self) -> None:
        """Close once what is queued was sent (a fatal ErrorResponse goes out first)."""
        self.protocol.close()
        if self.transport is None:
            return
        if self.writer is not None:
            if not self.transport.is_closing():
                self.transport.pause_reading()
            self.writer.close_when_drained(self.transport.close)
        else:
            self.transport.close()

    def _defer(self, fn: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_soon(fn)

    # ------------------------------------------------------------ dispatch
    def handle(self, msg: Message) -> None:
        """Check ``msg`` against the connection's state, then hand it to the side it belongs to."""
        if not self.authenticated:
            self._hello(msg)
            return
        self.protocol.receive(msg)
        _HANDLERS[type(msg)](self, msg)

    def _hello(self, msg: Hello) -> None:
        try:
            welcome = self.protocol.on_hello(msg)
        except AuthRefused as exc:
            self.fatal(str(exc), code=ErrorCode.AUTH)
            return
        self.authenticated = True
        self.identity = self.protocol.identity
        self._hello_timer.cancel()
        refusal = self.service.authenticated(self)
        if refusal:  # its credential's own connections are the cap: not asked again, as a full service is
            self.fatal(refusal, code=ErrorCode.LIMIT)
            return
        self.decoder.raise_limits(self.service.config.max_frame_size)
        self.client_id = msg.client_id
        self.client_host = msg.host_id
        self.consumers.locality = "local" if msg.host_id == self.service.host_id else "remote"
        self.send(welcome)

    def on_partition_request(self, msg: PartitionRequest) -> None:
        shared = self.transport_kind == "unix" and self.service.config.shared_memory
        part = self.service.partitions.get(msg.partition)
        if part is not None and part.readers is not None and not may_read(part.readers, part.owner, self.identity):
            self.send(ErrorResponse(
                f"reading partition {msg.partition!r} of exchange {part.exchange!r} is refused: its writer, credential "
                f"{part.owner!r}, lets {', '.join(repr(r) for r in part.readers) or 'no other credential'} read it, "
                f"and this connection authenticated as {self.identity!r}", msg.receiver_id, False, ErrorCode.FORBIDDEN))
            return
        self.consumers.request(msg, part, shared, self.on_view_available, spans=self.writer is not None)
        self.schedule_pump()

    def on_view_available(self, receiver_id: int) -> None:
        self.consumers.available(receiver_id)
        self.schedule_pump()

    def on_register(self, msg: RegisterPartition) -> None:
        try:
            part = self.service.register_partition(msg, self.identity)
        except (ValueError, RuntimeError) as exc:  # a limit reached keeps its own code
            self.send(ErrorResponse(str(exc), None, False, code_of(exc, ErrorCode.REGISTER_FAILED)))
            return
        except (OSError, MemoryError) as exc:  # out of fds or disk: this registration fails, the rest go on
            self.send(ErrorResponse(explain(exc, f"registering partition {msg.partition!r}"), None, False,
                                    code_of(exc, ErrorCode.REGISTER_FAILED)))
            return
        # a writer on this host (Unix socket) may push through its shared-memory arena
        self.producers.register(msg, part, self.transport_kind == "unix" and self.service.config.shared_memory)

    def on_fail_partition(self, msg: FailPartition) -> None:
        reason = msg.reason if len(msg.reason) <= MAX_REASON_LENGTH else msg.reason[:MAX_REASON_LENGTH - 6] + " [...]"
        self.service.producer_lost(self.producers.get(msg.handle).partition, reason)

    def schedule_pump(self) -> None:
        if not self.pump_scheduled and not self.closed:
            self.pump_scheduled = True
            asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        """Write available buffers until the transport reaches its high-water mark."""
        self.pump_scheduled = False
        self.consumers.pump(lambda: not self.paused and not self.closed)

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
            log.exception("rpc %s failed", msg.method)
            self.send(RpcResponse(msg.call_id, None, f"{msg.method} failed: {exc}", ErrorCode.INTERNAL))


def _closed_send(msg: Message) -> None:
    """What a closed connection's sides send to: nothing (a spill file's span is let go)."""
    if isinstance(msg, BufferResponse):
        _close_spans([msg.payload])


def _close_spans(pieces: list) -> None:
    """Let go of the spill-file descriptors of pieces that will not be sent."""
    for piece in pieces:
        if isinstance(piece, FileSpan):
            piece.close()


def _closed_defer(fn: Callable[[], None]) -> None:
    """What a closed connection's sides defer: nothing."""


def _closed_flow() -> None:
    """What a closed connection's socket writer pauses or resumes: nothing."""


def _closed_error(exc: BaseException) -> None:
    """Whom a closed connection's socket writer tells of a failure: no one."""


def _pumped(act: Callable[[ServerConnection, Any], None]) -> Callable[[ServerConnection, Any], None]:
    def handler(conn: ServerConnection, msg: Any) -> None:
        act(conn, msg)
        conn.schedule_pump()
    return handler


# what an open connection does with each message the table allows (connection.LEGAL); the same keys
_HANDLERS: dict[type, Callable[[ServerConnection, Any], None]] = {
    PartitionRequest: ServerConnection.on_partition_request,
    AddCredit: _pumped(lambda c, m: c.consumers.add_credit(m.receiver_id, m.credit)),
    ResumeConsumption: _pumped(lambda c, m: c.consumers.available(m.receiver_id)),
    CancelPartitionRequest: lambda c, m: c.consumers.cancel(m.receiver_id),
    SharedBuffersRead: lambda c, m: c.consumers.unpin(m.receiver_id, m.count),
    RegisterPartition: ServerConnection.on_register,
    PushBuffer: lambda c, m: c.producers.push(m),
    PushSharedBuffer: lambda c, m: c.producers.push(m),
    PushRegion: lambda c, m: c.producers.push(m),
    PushSharedRegion: lambda c, m: c.producers.push(m),
    FinishPartition: lambda c, m: c.producers.finish(m),
    FailPartition: ServerConnection.on_fail_partition,
    RpcRequest: lambda c, m: asyncio.ensure_future(c.on_rpc(m)),
    CloseRequest: lambda c, m: c.close(),
}
