"""A blocking client connection: used by writer tasks (pushing buffers) and for RPCs.

Spark's write tasks are plain synchronous Python; a blocking socket with the
sans-IO decoder is the cheapest way to push buffers from there (no thread hop).
It only moves bytes: the handshake and what is legal when are ``connection.py``'s.
"""
from __future__ import annotations

import itertools
import os
import select
import socket
import ssl
import threading
from typing import Any, Callable

from ..errors import ErrorCode, ServiceError, error_for
from .address import Address, parse_address
from .connection import ClientHandshake, ConnState, client_id
from .protocol import DEFAULT_MAX_FRAME, ErrorResponse, FrameDecoder, ProtocolError, RpcRequest, RpcResponse, encode

__all__ = ["BlockingConnection", "ConnectionPool", "ServiceError", "WRITER_CONNECTIONS", "client_id", "open_socket"]


SOCKET_BUFFER = 4 << 20  # a few buffers in flight per connection, on TCP and Unix sockets alike


def tune_socket(sock: socket.socket | None) -> None:
    """Large kernel buffers: with 1 MiB buffers, the defaults (about 200 KiB) cost a wakeup per slice."""
    if sock is None:
        return
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass


# A connection to a host that vanished (powered off, cut off: no reset comes) is given up within seconds instead of
# the kernel's minutes: keepalive probes while it is idle, and a limit on how long what was sent may stay
# unacknowledged. A live host's kernel answers both at once, however busy its service. Readers give up after about
# 10 s (they send only credit); a writer's replica connection after a minute (a stalled service's full window).
DEAD_PEER_IDLE = 5  # s without traffic before the first probe
DEAD_PEER_PROBES = (1, 5)  # s between probes, probes unanswered
READER_UNACKED_MS = 10_000
REPLICA_UNACKED_MS = 60_000


def detect_dead_peer(sock: socket.socket | None, unacked_ms: int = READER_UNACKED_MS) -> None:
    """Keepalive and a user timeout on a TCP socket (Linux; elsewhere left as the system has them)."""
    if sock is None:
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", DEAD_PEER_IDLE), ("TCP_KEEPINTVL", DEAD_PEER_PROBES[0]),
                        ("TCP_KEEPCNT", DEAD_PEER_PROBES[1]), ("TCP_USER_TIMEOUT", unacked_ms)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in options:
        try:
            sock.setsockopt(level, opt, value)
        except OSError:
            pass


# the service closed the connection before the TLS handshake finished: it had no room for another handshake
# (or the handshake's deadline passed); asked again like a plaintext refusal (network/retry.py)
TLS_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError, BrokenPipeError)


def tls_cut(address: object, exc: BaseException) -> ServiceError:
    """The refusal a TLS handshake cut by the service is: ``too_many_connections``, which clients ask again."""
    return error_for(ErrorCode.TOO_MANY_CONNECTIONS, f"the exchange service at {address} closed the connection "
                     f"during the TLS handshake ({exc}): it had no room for another handshake, or the handshake "
                     "took longer than its helloTimeout")


def open_socket(address: Address, timeout: float, ssl_ctx: ssl.SSLContext | None) -> socket.socket:
    try:
        if address.is_unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(address.path)
        else:
            sock = socket.create_connection((address.host, address.port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_ctx is not None:
                try:
                    sock = ssl_ctx.wrap_socket(sock, server_hostname=address.host)
                except TLS_CUT as exc:
                    sock.close()
                    raise tls_cut(address, exc) from None
    except ssl.SSLCertVerificationError as exc:
        raise error_for(ErrorCode.TLS, f"the exchange service at {address} failed TLS verification: {exc.verify_message} "
                           "(a certificate must name the address clients dial in its subjectAltName, or set "
                           "tls.checkHostname=false to trust the CA alone)") from None
    except OSError as exc:
        raise error_for(ErrorCode.UNREACHABLE, f"cannot reach the exchange service at {address}: {exc}") from None
    tune_socket(sock)
    return sock


class BlockingConnection:
    def __init__(self, address: str | Address, secret: str | None, *, timeout: float = 30.0,
                 ssl_ctx: ssl.SSLContext | None = None, host_id: str = "",
                 max_frame: int = DEFAULT_MAX_FRAME, expect_service: str = "") -> None:
        """``expect_service``: the id of the service meant, when known (``ClientHandshake``)."""
        self.address = parse_address(address) if isinstance(address, str) else address
        self.sock = open_socket(self.address, timeout, None if self.address.is_unix else ssl_ctx)
        self.decoder = FrameDecoder(max_frame)
        self.inbox: list[Any] = []
        self.stash: list[Any] = []  # messages that arrived while an RPC waited for its answer
        self._calls = itertools.count(1)
        self.timeout = timeout
        self.pool_key: tuple | None = None  # set by the ConnectionPool that made it
        self.location: dict | None = None  # the service's answer to ping, kept by a writer for the next task
        self.protocol = ClientHandshake(secret, host_id, self.address, expect_service)
        try:
            self._handshake(timeout)
        except BaseException:
            self.close()
            raise

    def _handshake(self, timeout: float) -> None:
        while not self.protocol.open:
            msg = self.recv(timeout)
            if msg is None:  # e.g. a plaintext client on a TLS port: both sides wait for the other to speak
                what = "ServerHello" if self.protocol.state is ConnState.GREETING else "Welcome"
                hint = " (is it a TLS port? then set tls.caFile)" if what == "ServerHello" else ""
                raise error_for(ErrorCode.TIMEOUT, f"service at {self.address} sent no {what} within {timeout:g} s{hint}")
            hello = self.protocol.step(msg)
            if hello is not None:
                self.send(hello)

    def send(self, msg: Any) -> None:
        try:
            pieces = encode(msg)
            if len(pieces) == 1 or isinstance(self.sock, ssl.SSLSocket):
                for piece in pieces:
                    self.sock.sendall(piece)
                return
            # header and payload in one system call, the payload not copied
            sent = self.sock.sendmsg(pieces)
            for piece in pieces:
                view = memoryview(piece).cast("B")
                if sent >= len(view):
                    sent -= len(view)
                    continue
                self.sock.sendall(view[sent:])
                sent = 0
        except OSError as exc:
            raise error_for(ErrorCode.CONNECTION_LOST, f"connection to the exchange service at {self.address} failed while sending: {exc}") from None

    def recv(self, timeout: float | None) -> Any:
        """The next message, waiting up to ``timeout`` s (None = forever); None on timeout."""
        while not self.inbox:
            if not self._fill(timeout):
                return None
        msg = self.inbox.pop(0)
        if self.protocol.open:
            self._check(msg)
        return msg

    def poll(self) -> list[Any]:
        """Messages that have already arrived, without waiting."""
        while self._fill(0):
            pass
        for msg in self.inbox:
            self._check(msg)
        out, self.inbox, self.stash = self.stash + self.inbox, [], []
        return out

    def _check(self, msg: Any) -> None:
        """A message the open connection may not receive closes it with a ServiceError saying which."""
        if self.protocol.state is ConnState.CLOSED:
            raise error_for(ErrorCode.CONNECTION_LOST, f"the connection to the exchange service at {self.address} "
                            "was closed after a protocol error")
        try:
            self.protocol.check(msg)
        except ServiceError:
            self.close()
            raise

    def _fill(self, timeout: float | None) -> bool:
        if timeout is not None:
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if not pending:
                ready, _, _ = select.select([self.sock], [], [], timeout)
                if not ready:
                    return False
        try:
            # select said it is readable: the socket keeps the connection's own timeout (a short poll must
            # not leave a 1 s timeout behind for the next blocking send)
            data = self.sock.recv(1 << 20)
        except OSError as exc:
            raise error_for(ErrorCode.CONNECTION_LOST, f"connection to the exchange service at {self.address} failed: {exc}") from None
        if not data:
            raise error_for(ErrorCode.CONNECTION_LOST, f"the exchange service at {self.address} closed the connection")
        try:
            self.inbox.extend(self.decoder.feed(data))
        except ProtocolError as exc:
            self.close()
            raise error_for(ErrorCode.PROTOCOL, f"protocol error: the exchange service at {self.address} sent "
                            f"garbage: {exc}") from None
        return True

    def call(self, method: str, timeout: float | None = None, **args: Any) -> Any:
        """A request/response RPC; raises ServiceError with the service's message on failure."""
        call_id = next(self._calls)
        self.send(RpcRequest(call_id, method, args))
        wait = self.timeout if timeout is None else timeout
        while True:
            msg = self.recv(wait)
            if msg is None:
                raise error_for(ErrorCode.TIMEOUT, f"{method} on the exchange service at {self.address} timed out after {wait:g} s")
            if isinstance(msg, RpcResponse) and msg.call_id == call_id:
                if msg.error:
                    raise error_for(msg.code, msg.error)
                return msg.result
            if isinstance(msg, ErrorResponse) and msg.fatal:
                raise error_for(msg.code, f"exchange service at {self.address}: {msg.message}")
            # anything else (credit, notifications) is for a caller that polls; keep it
            self.stash.append(msg)
            if len(self.stash) > 10000:
                raise error_for(ErrorCode.PROTOCOL, f"unexpected traffic while waiting for {method}")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "BlockingConnection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ConnectionPool:
    """Idle authenticated connections of this process, per address, for the next write task.

    Spark reuses its Python workers, so a write task need not open a connection (socket, ServerHello,
    Hello, Welcome) and ping the service for its location before registering its partition. A connection
    is given back only clean: nothing unread, nothing stashed. One taken from the pool is checked first: a
    readable idle socket means the service said something unasked or closed it (it restarted), and a new
    connection replaces it.
    """

    def __init__(self, per_address: int = 2) -> None:
        self.per_address = per_address
        self._idle: dict[tuple, list[BlockingConnection]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def take(self, key: tuple, connect: Callable[[], BlockingConnection]) -> BlockingConnection:
        if self._pid != os.getpid():  # a forked child: its parent's idle sockets are not its to talk on
            self._pid = os.getpid()
            self.clear()
        while True:
            with self._lock:
                idle = self._idle.get(key)
                conn = idle.pop() if idle else None
            if conn is None:
                conn = connect()
                conn.pool_key = key
                return conn
            if _quiet(conn):
                return conn
            conn.close()

    def give(self, conn: BlockingConnection) -> None:
        """Keep ``conn`` for the next task if it is clean and the pool has room; else close it."""
        key = conn.pool_key
        if key is None or self._pid != os.getpid() or conn.inbox or conn.stash or conn.decoder.pending or not _quiet(conn):
            conn.close()
            return
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.per_address:
                idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        with self._lock:
            idle = [c for conns in self._idle.values() for c in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()


def _quiet(conn: BlockingConnection) -> bool:
    """Open and with nothing to read (an idle connection the service has nothing more to say on)."""
    try:
        if conn.sock.fileno() < 0:
            return False
        if isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending():
            return False
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


WRITER_CONNECTIONS = ConnectionPool()
