"""Connections as state machines, without sockets: every (state, message) pair of the table, the
handshake driven end to end in memory, and the producer side's credit bookkeeping on real partitions."""
from __future__ import annotations

import pytest

from sparkflow_exchange import AuthenticationFailed, ErrorCode, ServiceError, ServiceUnavailable
from sparkflow_exchange import buffer_kinds as bk
from sparkflow_exchange.network import protocol as p
from sparkflow_exchange.network.connection import (
    LEGAL,
    AuthRefused,
    ClientHandshake,
    Connection,
    ConnState,
    Role,
    ServerHandshake,
)
from sparkflow_exchange.network.producers import Producers
from sparkflow_exchange.partition.buffer_pool import MemoryBudget
from sparkflow_exchange.partition.result_partition import ResultPartition

SAMPLES = {
    p.ServerHello: p.ServerHello("n"), p.Hello: p.Hello("c", ""), p.Welcome: p.Welcome("s", "h"),
    p.PartitionRequest: p.PartitionRequest("x", 0, 1, 2), p.AddCredit: p.AddCredit(1, 1),
    p.ResumeConsumption: p.ResumeConsumption(1), p.CancelPartitionRequest: p.CancelPartitionRequest(1),
    p.CloseRequest: p.CloseRequest(), p.BufferResponse: p.BufferResponse(1, 0, 0, 0, 0, b"x"),
    p.ErrorResponse: p.ErrorResponse("no"), p.RegisterPartition: p.RegisterPartition("x", 1, "HYBRID"),
    p.PartitionRegistered: p.PartitionRegistered("x", 1, 0, 1024), p.PushBuffer: p.PushBuffer(1, 0, 0, 0, b"x"),
    p.PushSharedBuffer: p.PushSharedBuffer(1, 0, 0, 0, 0, 0, 1), p.PushRegion: p.PushRegion(1, 0, 0, ((0, 0, 1),), b"x"),
    p.PushSharedRegion: p.PushSharedRegion(1, 0, 0, 0, ((0, 0, 1),)), p.SlotsFreed: p.SlotsFreed(1, (0,)),
    p.SharedBuffersRead: p.SharedBuffersRead(1, 1), p.ProducerCredit: p.ProducerCredit(1, 1),
    p.FinishPartition: p.FinishPartition(1), p.FailPartition: p.FailPartition(1, "r"),
    p.PartitionFinished: p.PartitionFinished(1), p.PartitionReleased: p.PartitionReleased(1, "gone"), p.RpcRequest: p.RpcRequest(1, "ping", {}),
    p.RpcResponse: p.RpcResponse(1), p.Notify: p.Notify("t", {}),
}

# the specification, written out: what each side may receive in each state (everything else is refused)
EXPECTED = {
    (Role.SERVER, ConnState.GREETING): {"Hello"},
    (Role.SERVER, ConnState.OPEN): {"PartitionRequest", "AddCredit", "ResumeConsumption", "CancelPartitionRequest",
                                    "SharedBuffersRead", "RegisterPartition", "PushBuffer", "PushSharedBuffer",
                                    "PushRegion", "PushSharedRegion", "FinishPartition", "FailPartition",
                                    "RpcRequest", "CloseRequest"},
    (Role.CLIENT, ConnState.GREETING): {"ServerHello", "ErrorResponse"},
    (Role.CLIENT, ConnState.PROVING): {"Welcome", "ErrorResponse"},
    (Role.CLIENT, ConnState.OPEN): {"BufferResponse", "ErrorResponse", "PartitionRegistered", "ProducerCredit",
                                    "SlotsFreed", "PartitionReleased", "PartitionFinished", "RpcResponse", "Notify"},
}


def test_samples_cover_every_message_type():
    assert set(SAMPLES) == set(p._TYPE_OF)
    assert set(LEGAL) == {(role, state) for role in Role for state in ConnState}


@pytest.mark.parametrize("role", list(Role), ids=lambda r: r.value)
@pytest.mark.parametrize("state", list(ConnState), ids=lambda s: s.value)
@pytest.mark.parametrize("mtype", list(SAMPLES), ids=lambda t: t.__name__)
def test_every_state_and_message_pair(role, state, mtype):
    conn = Connection(role)
    conn.state = state
    if mtype.__name__ in EXPECTED.get((role, state), set()):
        conn.receive(SAMPLES[mtype])
    else:
        with pytest.raises(p.ProtocolError, match=mtype.__name__):
            conn.receive(SAMPLES[mtype])


def test_every_message_an_open_server_accepts_has_a_handler():
    from sparkflow_exchange.network.server import _HANDLERS

    assert set(_HANDLERS) == LEGAL[Role.SERVER, ConnState.OPEN]


def test_no_message_is_legal_both_ways_except_errors():
    to_server = set().union(*(LEGAL[Role.SERVER, s] for s in ConnState))
    to_client = set().union(*(LEGAL[Role.CLIENT, s] for s in ConnState))
    assert to_server & to_client == set()
    assert to_server | to_client | {p.ErrorResponse} == set(SAMPLES)


def _handshake(server_secret, client_secret):
    server = ServerHandshake({"operator": server_secret} if server_secret else {}, "svc-1", "host-a")
    client = ClientHandshake(client_secret, "host-b", "test:1")
    hello = client.step(server.greeting())
    assert client.state is ConnState.PROVING and isinstance(hello, p.Hello) and hello.host_id == "host-b"
    return server, client, hello


@pytest.mark.parametrize("secret", ["s3cret", None])
def test_the_handshake_opens_both_sides(secret):
    server, client, hello = _handshake(secret, secret)
    welcome = server.on_hello(hello)
    assert server.state is ConnState.OPEN and server.hello == hello and server.identity == "operator"
    assert client.step(welcome) is None
    assert client.state is ConnState.OPEN and client.welcome == welcome
    client.check(p.ProducerCredit(1, 3))  # open: traffic flows


def test_a_wrong_client_secret_is_refused_and_closes_the_server_side():
    server, client, hello = _handshake("right", "wrong")
    with pytest.raises(AuthRefused, match="wrong secret"):
        server.on_hello(hello)
    assert server.state is ConnState.GREETING and server.hello is None  # never open


CREDENTIALS = {"operator": "op-secret", "alice": "alice-secret", "bob": "bob-secret"}


def test_a_proof_belongs_to_one_connection():
    """A Hello made for one connection is refused on another: the other's nonce differs."""
    first = ServerHandshake(CREDENTIALS, "svc-1", "host-a")
    other = ServerHandshake(CREDENTIALS, "svc-1", "host-a")
    hello = ClientHandshake("op-secret", "host-b", "test:1").step(first.greeting())
    with pytest.raises(AuthRefused, match="wrong secret"):
        other.on_hello(hello)
    assert first.on_hello(hello) and first.identity == "operator"


def test_a_proof_belongs_to_the_service_it_was_made_for():
    """Even with the same server nonce (a relay that forwards one service's greeting as another's), a proof
    made for one service id is refused by another service."""
    real = ServerHandshake(CREDENTIALS, "svc-real", "host-a")
    claimed = ServerHandshake(CREDENTIALS, "svc-claimed", "host-a")
    claimed.nonce = real.nonce
    hello = ClientHandshake("op-secret", "host-b", "test:1").step(claimed.greeting())
    with pytest.raises(AuthRefused, match="wrong secret"):
        real.on_hello(hello)


def test_a_proof_covers_the_clients_nonce_and_the_service_proof_too():
    """A relay that swaps the client's nonce (to have the service prove itself on another connection) breaks the
    client's proof; and the service's proof checks out only for the connection and service it was made for."""
    server = ServerHandshake(CREDENTIALS, "svc-1", "host-a")
    client = ClientHandshake("alice-secret", "host-b", "test:1")
    hello = client.step(server.greeting())
    swapped = p.Hello(hello.client_id, hello.proof, hello.host_id, "0" * 32)
    with pytest.raises(AuthRefused, match="wrong secret"):
        server.on_hello(swapped)
    welcome = server.on_hello(hello)
    assert server.identity == "alice"
    other = ClientHandshake("alice-secret", "host-b", "test:1")
    other.step(p.ServerHello(server.nonce, "svc-1", "host-a"))  # the same greeting, another client nonce
    with pytest.raises(AuthenticationFailed, match="wrong secret proof"):
        other.step(welcome)
    assert client.step(welcome) is None and client.state is ConnState.OPEN


def test_a_client_expecting_one_service_proves_nothing_to_another():
    server = ServerHandshake(CREDENTIALS, "svc-other", "host-a")
    client = ClientHandshake("op-secret", "host-b", "test:1", expect_service="svc-meant")
    with pytest.raises(AuthenticationFailed, match="is 'svc-other', but 'svc-meant' was expected") as info:
        client.step(server.greeting())
    assert info.value.code is ErrorCode.AUTH and client.state is ConnState.CLOSED
    meant = ServerHandshake(CREDENTIALS, "svc-meant", "host-a")
    expecting = ClientHandshake("op-secret", "host-b", "test:1", expect_service="svc-meant")
    hello = expecting.step(meant.greeting())
    assert expecting.step(meant.on_hello(hello)) is None and expecting.state is ConnState.OPEN


@pytest.mark.parametrize("nonce", ["n" * 32, "AB" * 16, "ab" * 15, "ab" * 16 + ":x"])
def test_nonces_that_could_shift_a_field_are_refused(nonce):
    client = ClientHandshake("s", "host-b", "test:1")
    with pytest.raises(ServiceError, match="nonce that is not 32 lowercase hex digits") as info:
        client.step(p.ServerHello(nonce, "svc-1", "host-a"))
    assert info.value.code is ErrorCode.PROTOCOL
    server = ServerHandshake({"operator": "s"}, "svc-1", "host-a")
    with pytest.raises(AuthRefused, match="nonce is not 32 lowercase hex digits"):
        server.on_hello(p.Hello("c", "00" * 32, "host-b", nonce))


@pytest.mark.parametrize("proof, message", [("", "did not prove"), ("00" * 32, "wrong secret proof")])
def test_a_service_that_cannot_prove_the_secret_is_not_trusted(proof, message):
    _server, client, _hello = _handshake("s", "s")
    with pytest.raises(AuthenticationFailed, match=message):
        client.step(p.Welcome("svc-1", "host-a", proof))
    assert client.state is ConnState.CLOSED


@pytest.mark.parametrize("code, cls", [(ErrorCode.TOO_MANY_CONNECTIONS, ServiceUnavailable),
                                       (ErrorCode.AUTH, AuthenticationFailed)])
def test_a_refusal_during_the_handshake_is_the_public_error_of_its_code(code, cls):
    client = ClientHandshake("s", "", "test:1")
    with pytest.raises(cls, match="refused the connection: busy") as info:
        client.step(p.ErrorResponse("busy", None, True, code))
    assert info.value.code is code and client.state is ConnState.CLOSED


def test_a_second_server_hello_closes_the_client_with_a_protocol_error():
    server, client, hello = _handshake("s", "s")
    client.step(server.on_hello(hello))
    with pytest.raises(ServiceError, match="second ServerHello") as info:
        client.check(p.ServerHello("again"))
    assert info.value.code is ErrorCode.PROTOCOL and client.state is ConnState.CLOSED


def test_a_request_before_hello_is_refused():
    server = ServerHandshake({"operator": "s"}, "svc", "h")
    with pytest.raises(p.ProtocolError, match="expected Hello as the first message, got PartitionRequest"):
        server.on_hello(SAMPLES[p.PartitionRequest])


# ---------------------------------------------------------------- producer credit, sans-IO
class Wire:
    """What the producer side sends and defers, kept for the test to look at."""

    def __init__(self) -> None:
        self.sent: list = []
        self.deferred: list = []
        self.lost: list = []

    def producers(self) -> Producers:
        return Producers(lambda msg: self.sent.append(msg), self.deferred.append,
                         lambda part, reason: self.lost.append(reason))

    def take(self) -> list:
        out, self.sent = self.sent, []
        return out


def _partition(tmp_path, ptype="PIPELINED_BOUNDED", slots=2):
    return ResultPartition("p0", 1, ptype, MemoryBudget(1 << 20), slots, 1024, tmp_path)


def test_credit_is_what_the_pool_holds_and_comes_back_as_readers_free_it(tmp_path):
    wire = Wire()
    producers = wire.producers()
    part = _partition(tmp_path)
    handle = producers.register(p.RegisterPartition("p0", 1, "PIPELINED_BOUNDED"), part, shared=False)
    registered, credit = wire.take()
    assert registered == p.PartitionRegistered("p0", handle, 0, 1024, 0)
    assert credit == p.ProducerCredit(handle, 2)
    for i in range(2):
        producers.push(p.PushBuffer(handle, 0, bk.BufferKind.DATA, 0, b"buf%d" % i))
    assert wire.take() == []  # the pool is full: no credit
    with pytest.raises(p.ProtocolError, match="PushBuffer without credit for partition p0"):
        producers.push(p.PushBuffer(handle, 0, bk.BufferKind.DATA, 0, b"one too many"))
    view = part.create_view(0, 0, lambda: None)
    item, _seq, _backlog = view.take()  # a reader consumes a buffer: its slot is free again
    assert bytes(item.payload) == b"buf0"
    assert wire.take() == [p.ProducerCredit(handle, 1)]


def test_malformed_pushes_are_protocol_errors(tmp_path):
    wire = Wire()
    producers = wire.producers()
    handle = producers.register(p.RegisterPartition("p0", 1, "HYBRID"), _partition(tmp_path, "HYBRID"), False)
    with pytest.raises(p.ProtocolError, match="unknown partition handle 99"):
        producers.push(p.PushBuffer(99, 0, 0, 0, b"x"))
    with pytest.raises(p.ProtocolError, match="which has no shared-memory arena"):
        producers.push(p.PushSharedBuffer(handle, 0, bk.BufferKind.DATA, 0, 0, 0, 1))
    with pytest.raises(p.ProtocolError, match="kind 2 is not data"):
        producers.push(p.PushRegion(handle, 2, 0, ((0, 0, 1),), b"x"))


def test_a_count_mismatch_at_finish_fails_the_partition_and_tells_the_writer(tmp_path):
    wire = Wire()
    producers = wire.producers()
    part = _partition(tmp_path, "HYBRID")
    handle = producers.register(p.RegisterPartition("p0", 1, "HYBRID"), part, False)
    producers.push(p.PushBuffer(handle, 0, bk.BufferKind.DATA, 0, b"x"))
    wire.take()
    producers.finish(p.FinishPartition(handle, {"buffers": [2], "rows": [7]}))
    (error,) = wire.take()
    assert isinstance(error, p.ErrorResponse) and error.code == ErrorCode.ROWS_LOST
    assert wire.lost == [error.message]


def test_finish_detaches_and_a_lost_connection_fails_what_is_still_written(tmp_path):
    wire = Wire()
    producers = wire.producers()
    done = producers.register(p.RegisterPartition("p0", 1, "HYBRID"), _partition(tmp_path, "HYBRID"), False)
    producers.finish(p.FinishPartition(done, {"buffers": [0], "rows": [0]}))
    assert isinstance(wire.take()[-1], p.PartitionFinished)
    with pytest.raises(p.ProtocolError, match=f"unknown partition handle {done}"):
        producers.get(done)
    running = ResultPartition("p1", 1, "HYBRID", MemoryBudget(1 << 20), 2, 1024, tmp_path)
    producers.register(p.RegisterPartition("p1", 1, "HYBRID"), running, False)
    producers.connection_lost("host:42")
    assert wire.lost == ["connection of its writer (host:42) was lost before finish"]
    assert list(producers.values()) == []


@pytest.mark.skipif(not __import__("sparkflow_exchange.partition.shared_arena", fromlist=["x"]).available(),
                    reason="no writable /dev/shm")
def test_arena_slots_are_in_use_until_freed_and_announced_after_the_callback(tmp_path):
    from sparkflow_exchange.partition.shared_arena import SharedArena

    writer_arena = SharedArena.create(2, 4096)
    try:
        wire = Wire()
        producers = wire.producers()
        part = ResultPartition("p0", 1, "PIPELINED_BOUNDED", MemoryBudget(1 << 20), 2, 4096, tmp_path)
        register = p.RegisterPartition("p0", 1, "PIPELINED_BOUNDED", shm_path=str(writer_arena.path), shm_slots=2,
                                       shm_slot_size=4096)
        handle = producers.register(register, part, shared=True)
        registered, credit = wire.take()
        assert registered.shm_slots == 2 and credit == p.ProducerCredit(handle, 2)
        writer_arena.slot(0)[:5] = b"hello"
        producers.push(p.PushSharedBuffer(handle, 0, bk.BufferKind.DATA, 0, 0, 0, 5))
        with pytest.raises(p.ProtocolError, match="arena slot 0 is in use"):
            producers.push(p.PushSharedBuffer(handle, 0, bk.BufferKind.DATA, 0, 0, 0, 5))
        with pytest.raises(p.ProtocolError, match=r"arena slot 2 is outside 0\.\.1"):
            producers.push(p.PushSharedBuffer(handle, 0, bk.BufferKind.DATA, 0, 2, 0, 5))
        with pytest.raises(p.ProtocolError, match="5000 bytes at offset 0 do not fit a slot of 4096 bytes"):
            producers.push(p.PushSharedBuffer(handle, 0, bk.BufferKind.DATA, 0, 1, 0, 5000))
        view = part.create_view(0, 0, lambda: None)
        item, _seq, _backlog = view.take()
        assert bytes(item.payload) == b"hello"
        assert wire.take() == [] and len(wire.deferred) == 1  # not announced from inside the freeing callback
        wire.deferred.pop()()
        assert wire.take() == [p.SlotsFreed(handle, (0,)), p.ProducerCredit(handle, 1)]
        part.release()
    finally:
        writer_arena.unlink()


def test_a_release_is_told_to_the_writer_at_once_and_again_at_finish(tmp_path):
    wire = Wire()
    producers = wire.producers()
    part = _partition(tmp_path, "HYBRID")
    handle = producers.register(p.RegisterPartition("p0", 1, "HYBRID"), part, False)
    wire.take()
    part.release("the exchange was dropped", ErrorCode.REPLACED)
    (told,) = wire.take()
    assert told == p.PartitionReleased(handle, "partition p0 of exchange '' was released while it was being "
                                               "written: the exchange was dropped", ErrorCode.REPLACED)
    producers.push(p.PushBuffer(handle, 0, bk.BufferKind.DATA, 0, b"late"))  # on its way before the writer heard
    assert wire.take() == []  # dropped: no error, no credit
    producers.finish(p.FinishPartition(handle, {"buffers": [1], "rows": [1]}))
    assert wire.take() == [told]  # told again, not a count mismatch
