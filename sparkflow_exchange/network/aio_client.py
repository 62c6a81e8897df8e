"""The consumer's client: one multiplexed connection per (process, service), on an IO thread.

Flink's NettyClient + PartitionRequestClientFactory. A process has one
:class:`ClientRuntime` (an event loop on a daemon thread) and at most one
:class:`ClientConnection` per service address; every input channel of every
gate in the process shares it, keyed by receiver id. Channel callbacks run on
the IO thread; gates hand results to the Spark task thread through queues.
"""
from __future__ import annotations

import asyncio
import itertools
import ssl
import threading
from typing import Any, Callable, Protocol

from ..errors import ErrorCode, ServiceError, error_for
from ..kinds import ExchangeState
from . import auth
from .address import Address, parse_address
from .blocking_client import TLS_CUT, detect_dead_peer, tls_cut, tune_socket
from .connection import ClientHandshake
from .protocol import (
    DEFAULT_MAX_FRAME,
    BufferResponse,
    ErrorResponse,
    FrameDecoder,
    Notify,
    ProtocolError,
    RpcRequest,
    RpcResponse,
    encode,
)
from .retry import connect_retrying_async

_receiver_ids = itertools.count(1)


def next_receiver_id() -> int:
    return next(_receiver_ids)


class ChannelHandler(Protocol):
    def on_message(self, msg: BufferResponse | ErrorResponse) -> None: ...
    def on_connection_lost(self, reason: str) -> None: ...


class ClientConnection(asyncio.BufferedProtocol):
    def __init__(self, address: Address, secret: str | None, host_id: str, max_frame: int = DEFAULT_MAX_FRAME,
                 expect_service: str = "") -> None:
        self.address = address
        self.protocol = ClientHandshake(secret, host_id, address, expect_service)
        self.decoder = FrameDecoder(max_frame)
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.channels: dict[int, ChannelHandler] = {}
        self.topics: dict[str, Callable[[dict], None]] = {}
        self._calls = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.lost_reason: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        tune_socket(sock)
        if not self.address.is_unix:
            detect_dead_peer(sock)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            messages = self.decoder.buffer_updated(nbytes)
        except ProtocolError as exc:
            self._lose(f"garbage from the exchange service at {self.address}: {exc}", code=ErrorCode.PROTOCOL)
            return
        for msg in messages:
            self.dispatch(msg)

    def dispatch(self, msg: Any) -> None:
        try:
            if not self.protocol.open:
                self._handshake(msg)
                return
            self.protocol.check(msg)
        except ServiceError as exc:
            self._lose(str(exc), code=exc.code)
            return
        if isinstance(msg, BufferResponse):
            handler = self.channels.get(msg.receiver_id)
            if handler is not None:
                handler.on_message(msg)
        elif isinstance(msg, RpcResponse):
            fut = self._pending.pop(msg.call_id, None)
            if fut is not None and not fut.done():
                if msg.error:
                    fut.set_exception(error_for(msg.code, msg.error))
                else:
                    fut.set_result(msg.result)
        elif isinstance(msg, Notify):
            callback = self.topics.get(msg.topic)
            if callback is not None:
                callback(msg.body)
        elif isinstance(msg, ErrorResponse):
            if msg.receiver_id is not None and msg.receiver_id in self.channels:
                self.channels[msg.receiver_id].on_message(msg)
            elif msg.fatal:
                self._lose(f"exchange service at {self.address}: {msg.message}", code=msg.code)

    def _handshake(self, msg: Any) -> None:
        hello = self.protocol.step(msg)
        if hello is not None:
            self.send(hello)
        elif self.protocol.open:
            self.ready.set_result(self.protocol.welcome)

    def send(self, msg: Any) -> None:
        if self.transport is not None and not self.transport.is_closing():
            for piece in encode(msg):  # not writelines: in 3.11 it joins, copying every payload
                self.transport.write(piece)

    async def rpc(self, method: str, args: dict, timeout: float = 30.0) -> Any:
        await self.ready
        call_id = next(self._calls)
        fut = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        self.send(RpcRequest(call_id, method, args))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            self._pending.pop(call_id, None)
            raise error_for(ErrorCode.TIMEOUT, f"{method} on the exchange service at {self.address} timed out "
                            f"after {timeout:g} s") from None

    def _lose(self, reason: str, code: ErrorCode | str = ErrorCode.CONNECTION_LOST) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        if not self.ready.done():
            self.ready.set_exception(error_for(code, reason))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self.lost_reason or f"connection to the exchange service at {self.address} was lost" + (f": {exc}" if exc else "")
        self.lost_reason = reason
        if not self.ready.done():
            self.ready.set_exception(error_for(ErrorCode.CONNECTION_LOST, reason))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(error_for(ErrorCode.CONNECTION_LOST, reason))
        for handler in list(self.channels.values()):
            handler.on_connection_lost(reason)
        for callback in list(self.topics.values()):
            callback({"state": ExchangeState.LOST, "reason": reason})

    @property
    def alive(self) -> bool:
        return self.lost_reason is None and self.transport is not None and not self.transport.is_closing()


async def open_connection(address: str | Address, secret: str | None, *, host_id: str = "",
                          ssl_ctx: ssl.SSLContext | None = None, timeout: float = 30.0,
                          max_frame: int = DEFAULT_MAX_FRAME, expect_service: str = "") -> ClientConnection:
    """A connection whose handshake is done. ``expect_service``: the id of the service meant (when known):
    another one answering at ``address`` is refused before anything is proven to it."""
    addr = parse_address(address) if isinstance(address, str) else address
    loop = asyncio.get_running_loop()
    try:
        if addr.is_unix:
            _, conn = await asyncio.wait_for(
                loop.create_unix_connection(lambda: ClientConnection(addr, secret, host_id, max_frame, expect_service), addr.path), timeout)
        else:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: ClientConnection(addr, secret, host_id, max_frame, expect_service), addr.host, addr.port,
                                       ssl=ssl_ctx), timeout)
    except ssl.SSLCertVerificationError as exc:
        raise error_for(ErrorCode.TLS, f"the exchange service at {addr} failed TLS verification: {exc.verify_message} "
                           "(a certificate must name the address clients dial in its subjectAltName, or set "
                           "tls.checkHostname=false to trust the CA alone)") from None
    except TLS_CUT as exc:
        if ssl_ctx is None or addr.is_unix:
            raise error_for(ErrorCode.UNREACHABLE, f"cannot reach the exchange service at {addr}: {exc}") from None
        raise tls_cut(addr, exc) from None
    except (OSError, asyncio.TimeoutError) as exc:
        raise error_for(ErrorCode.UNREACHABLE, f"cannot reach the exchange service at {addr}: {exc or 'timed out'}") from None
    try:
        await asyncio.wait_for(conn.ready, timeout)
    except asyncio.TimeoutError:
        conn.transport.close()
        raise error_for(ErrorCode.TIMEOUT, f"the exchange service at {addr} sent no ServerHello within {timeout:g} s "
                        "(is it a TLS port? then set tls.caFile)") from None
    return conn


async def rpc_once(address: str, secret: str | None, config: Any, method: str, args: dict, *,
                   expect_service: str = "") -> Any:
    """One call on a connection of its own (``expect_service``: the id of the service meant, when known)."""
    ssl_ctx = auth.ssl_for(address, config)
    conn = await connect_retrying_async(
        lambda: open_connection(address, secret, ssl_ctx=ssl_ctx, max_frame=config.max_frame_size,
                                expect_service=expect_service), 30.0)
    try:
        return await conn.rpc(method, args)
    finally:
        conn.transport.close()


class ClientRuntime:
    """The process's IO thread and its connection cache."""

    _instance: "ClientRuntime | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="sparkflow-exchange-io", daemon=True)
        self.thread.start()
        self._connections: dict[tuple[str, str | None], asyncio.Future] = {}

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @classmethod
    def get(cls) -> "ClientRuntime":
        with cls._lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = ClientRuntime()
            return cls._instance

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the IO thread and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call_soon(self, fn: Callable, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    async def connection(self, address: str, secret: str | None, *, host_id: str = "",
                         ssl_ctx: ssl.SSLContext | None = None, max_frame: int = DEFAULT_MAX_FRAME) -> ClientConnection:
        """The shared connection to a service (IO thread only)."""
        key = (address, secret)
        pending = self._connections.get(key)
        if pending is not None:
            try:
                conn = await asyncio.shield(pending)
                if conn.alive:
                    return conn
            except ServiceError:
                pass
        pending = asyncio.ensure_future(connect_retrying_async(  # asked again while the service has no room
            lambda: open_connection(address, secret, host_id=host_id, ssl_ctx=ssl_ctx, max_frame=max_frame), 30.0))
        self._connections[key] = pending
        return await asyncio.shield(pending)
