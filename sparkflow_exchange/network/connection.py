"""A connection's state and which message is legal in which state, sans-IO (h11's rule).

Both ends of a connection are state machines. ``LEGAL`` is the one table saying which messages a
side may receive in each state; :class:`Connection` holds a side's state and checks every received
message against the table before anything acts on it. The handshake is written once, here: the
server's side in :class:`ServerHandshake`, the client's in :class:`ClientHandshake`, which both
clients (the IO thread's and the blocking one) drive with the messages they receive. Nothing here
touches a socket::

    server:  GREETING --Hello (proof good)--> OPEN --close--> CLOSED
    client:  GREETING --ServerHello--> PROVING --Welcome (proof good)--> OPEN --close--> CLOSED
"""
from __future__ import annotations

import enum
import os
import socket
from typing import Mapping

from ..errors import ErrorCode, ServiceError, error_for
from . import auth
from .protocol import (
    AddCredit,
    BufferResponse,
    CancelPartitionRequest,
    CloseRequest,
    ErrorResponse,
    FailPartition,
    FinishPartition,
    Hello,
    Message,
    Notify,
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
    SlotsFreed,
    Welcome,
)


class Role(enum.Enum):
    SERVER = "server"
    CLIENT = "client"


class ConnState(enum.Enum):
    GREETING = "greeting"  # server: ServerHello sent, waits for Hello; client: waits for ServerHello
    PROVING = "proving"  # client: Hello sent, waits for the service's Welcome (its proof)
    OPEN = "open"  # both sides proved the secret
    CLOSED = "closed"


CONSUMER_REQUESTS = frozenset({PartitionRequest, AddCredit, ResumeConsumption, CancelPartitionRequest,
                               SharedBuffersRead})
PRODUCER_REQUESTS = frozenset({RegisterPartition, PushBuffer, PushSharedBuffer, PushRegion, PushSharedRegion,
                               FinishPartition, FailPartition})
_NOTHING: frozenset[type] = frozenset()

# the one table: what each side may receive in each state
LEGAL: dict[tuple[Role, ConnState], frozenset[type]] = {
    (Role.SERVER, ConnState.GREETING): frozenset({Hello}),
    (Role.SERVER, ConnState.PROVING): _NOTHING,  # a server never waits for a proof: it checks the Hello's
    (Role.SERVER, ConnState.OPEN): CONSUMER_REQUESTS | PRODUCER_REQUESTS | {RpcRequest, CloseRequest},
    (Role.SERVER, ConnState.CLOSED): _NOTHING,
    (Role.CLIENT, ConnState.GREETING): frozenset({ServerHello, ErrorResponse}),
    (Role.CLIENT, ConnState.PROVING): frozenset({Welcome, ErrorResponse}),
    (Role.CLIENT, ConnState.OPEN): frozenset({BufferResponse, ErrorResponse, PartitionRegistered, ProducerCredit,
                                              SlotsFreed, PartitionReleased, PartitionFinished, RpcResponse,
                                              Notify}),
    (Role.CLIENT, ConnState.CLOSED): _NOTHING,
}


class Connection:
    """One side's state; :meth:`receive` refuses what the table does not allow in it."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.state = ConnState.GREETING

    def receive(self, msg: Message) -> None:
        """Raises :class:`ProtocolError` naming the message and the state when ``msg`` is not legal now."""
        if type(msg) not in LEGAL[self.role, self.state]:
            raise ProtocolError(self._illegal(msg))

    def _illegal(self, msg: Message) -> str:
        name = type(msg).__name__
        if self.role is Role.SERVER and self.state is ConnState.GREETING:
            return f"expected Hello as the first message, got {name}"
        if isinstance(msg, ServerHello):
            return "a second ServerHello"
        return f"an unexpected {name} (connection state {self.state.value})"

    def close(self) -> None:
        self.state = ConnState.CLOSED

    @property
    def open(self) -> bool:
        return self.state is ConnState.OPEN


class AuthRefused(Exception):
    """The client did not prove the secret; the message says how."""


class ServerHandshake(Connection):
    """The service's side: greet with a nonce, find the credential the client's proof was made with, prove
    that credential's secret back."""

    def __init__(self, credentials: Mapping[str, str], service_id: str, host_id: str) -> None:
        super().__init__(Role.SERVER)
        self.credentials = credentials  # name -> secret (none: a service without authentication)
        self.service_id = service_id
        self.host_id = host_id
        self.nonce = auth.new_nonce()
        self.hello: Hello | None = None
        self.identity = ""  # the credential the client proved (auth.OPERATOR: the service's own secret)

    def greeting(self) -> ServerHello:
        return ServerHello(self.nonce, self.service_id, self.host_id)

    def on_hello(self, msg: Hello) -> Welcome:
        """The Welcome to send; raises :class:`AuthRefused` when the proof is missing or wrong (the caller
        says so to the client, then closes)."""
        self.receive(msg)
        who = auth.identify(self.credentials, self.nonce, msg.nonce, self.service_id, msg.proof)
        if isinstance(who, str):
            raise AuthRefused(who)
        self.hello = msg
        self.identity = who.name
        self.state = ConnState.OPEN
        return Welcome(self.service_id, self.host_id,
                       auth.prove_service(who.secret, msg.nonce, self.nonce, self.service_id))


def client_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class ClientHandshake(Connection):
    """The client's side: answer the ServerHello with a proof and a nonce, check the service's proof.

    ``expect_service``: the id of the service the client means to reach, when it knows it (a producer's
    registered location names it): a greeting from another service is refused before any proof is made,
    so a listener relaying some other service's greeting gets nothing it could use there.
    Refusals and failures are raised as the public errors (``errors.error_for``) naming ``address``."""

    def __init__(self, secret: str | None, host_id: str, address: object, expect_service: str = "") -> None:
        super().__init__(Role.CLIENT)
        self.secret = secret
        self.host_id = host_id
        self.address = address
        self.expect_service = expect_service
        self.nonce = auth.new_nonce()  # the service proves the secret against this
        self.server_hello: ServerHello | None = None
        self.welcome: Welcome | None = None

    def step(self, msg: Message) -> Hello | None:
        """Take a message received before the handshake ended; returns the Hello to send, if any."""
        try:
            self.receive(msg)
        except ProtocolError as exc:
            raise self.fail(ErrorCode.PROTOCOL, f"protocol error: the exchange service at {self.address} sent {exc}") from exc
        if isinstance(msg, ErrorResponse):
            raise self.fail(msg.code, f"service at {self.address} refused the connection: {msg.message}")
        if isinstance(msg, ServerHello):
            if self.expect_service and msg.service_id != self.expect_service:
                raise self.fail(ErrorCode.AUTH, f"the exchange service at {self.address} is {msg.service_id!r}, but "
                                                f"{self.expect_service!r} was expected there (it was restarted, or "
                                                "another listener answers at that address): nothing was proven to it")
            if self.secret and not auth.valid_nonce(msg.nonce):
                raise self.fail(ErrorCode.PROTOCOL, f"protocol error: the exchange service at {self.address} sent a "
                                                    f"nonce that is not {auth.NONCE_DIGITS} lowercase hex digits")
            self.server_hello = msg
            self.state = ConnState.PROVING
            return Hello(client_id(), auth.prove(self.secret, msg.nonce, self.nonce, msg.service_id), self.host_id,
                         self.nonce)
        distrust = auth.verify_service(self.secret, self.nonce, self.server_hello.nonce,
                                       self.server_hello.service_id, msg.proof)
        if distrust:
            raise self.fail(ErrorCode.AUTH, f"service at {self.address} is not trusted: {distrust}")
        self.welcome = msg
        self.state = ConnState.OPEN
        return None

    def check(self, msg: Message) -> None:
        """A message received on the open connection: a :class:`ServiceError` when it is not legal."""
        try:
            self.receive(msg)
        except ProtocolError as exc:
            raise self.fail(ErrorCode.PROTOCOL, f"protocol error: the exchange service at {self.address} sent {exc}") from exc

    def fail(self, code: ErrorCode | str, message: str) -> ServiceError:
        self.close()
        return error_for(code, message)
