"""Nothing for strangers: before a client proves the secret it costs the service almost nothing,
the number of such clients is capped, the client checks the service too, and TLS checks host names."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time

import pytest
from harness import client_config, fd_count

from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.network import auth
from sparkflow_exchange.network.aio_client import open_connection
from sparkflow_exchange.network.blocking_client import BlockingConnection, ServiceError
from sparkflow_exchange.network.protocol import (
    MAGIC,
    PREAUTH_MAX_FRAME,
    PREFIX,
    VERSION,
    ErrorResponse,
    FrameDecoder,
    Hello,
    MsgType,
    ServerHello,
    Welcome,
    encode_bytes,
)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _connect_raw(svc) -> tuple[socket.socket, FrameDecoder, ServerHello]:
    host, port = svc.tcp.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    decoder = FrameDecoder()
    messages: list = []
    while not messages:
        messages = decoder.feed(sock.recv(65536))
    assert isinstance(messages[0], ServerHello), messages
    return sock, decoder, messages[0]


def _next_error(sock: socket.socket, decoder: FrameDecoder, timeout: float = 10.0) -> ErrorResponse:
    sock.settimeout(timeout)
    while True:
        data = sock.recv(65536)
        assert data, "closed without an error frame"
        for msg in decoder.feed(data):
            if isinstance(msg, ErrorResponse):
                return msg


def _served_a_write(svc) -> None:
    """One small write committed: its commit needs what the service imports on its own once ready, so after it
    the service's memory holds its whole start (a baseline that does not grow by an import meanwhile)."""
    import pyarrow as pa

    import sparkflow_exchange as sfe

    schema = pa.schema([("id", pa.int64())])
    with sfe.open_writer("strangers-baseline", schema, keys=["id"], num_subpartitions=2, coordinator=svc.tcp,
                         service=svc.tcp, secret=svc.secret) as writer:
        writer.write(pa.record_batch([pa.array(range(100), pa.int64())], schema=schema))


def _healthy(svc) -> None:
    with svc.connect() as conn:
        assert conn.call("ping")["service_id"]


def _healthy_again(svc, timeout: float = 10.0) -> None:
    """A well-behaved client is served again once the service noticed closed connections (a loop turn or two)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _healthy(svc)
            return
        except ServiceError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_big_frames_before_authentication_are_refused_from_their_prefix(tmp_service):
    """The attack that took a service to 2.4 GiB: connections announcing 60 MiB frames, no Hello (200 here)."""
    svc = tmp_service()
    _served_a_write(svc)  # what the service loads once ready (numpy, on a thread) is in before the baseline
    before = _rss_kib(svc.proc.pid)
    announce = PREFIX.pack(60 << 20, MAGIC, VERSION, MsgType.PUSH_BUFFER, 14)
    clients = []
    for _ in range(200):
        sock, decoder, _hello = _connect_raw(svc)
        sock.sendall(announce)
        clients.append((sock, decoder))
    for sock, decoder in clients:
        error = _next_error(sock, decoder)
        assert error.fatal and f"exceeds the maximum frame size {PREAUTH_MAX_FRAME}" in error.message
        sock.close()
    grown_mib = (_rss_kib(svc.proc.pid) - before) / 1024
    assert grown_mib < 16, f"service grew by {grown_mib:.0f} MiB for 200 strangers"
    _healthy(svc)


def test_unauthenticated_connections_are_capped_and_the_cap_frees(tmp_service):
    # a Hello timeout of 10 min: the silent ones stay fresh (not idle) for the whole test, so the cap refuses
    svc = tmp_service(conf={"maxUnauthenticatedConnections": "4", "helloTimeout": "600"})
    silent = [_connect_raw(svc) for _ in range(4)]  # connected, greeted, never say Hello
    host, port = svc.tcp.rsplit(":", 1)
    sock, decoder = socket.create_connection((host, int(port)), timeout=10), FrameDecoder()
    error = _next_error(sock, decoder)
    assert error.fatal and "maxUnauthenticatedConnections=4" in error.message
    assert sock.recv(65536) == b""
    with pytest.raises(ServiceError, match="too many connections that have not authenticated"):
        svc.connect()
    for s, _d, _h in silent:
        s.close()
    _healthy_again(svc)


def _strangers(svc, count: int, source: str | None = None) -> list[tuple[socket.socket, FrameDecoder, object]]:
    """``count`` connections that never say Hello, each with its first frame: a ServerHello (admitted) or
    the error that refused it."""
    host, port = svc.tcp.rsplit(":", 1)
    out = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10,
                                        source_address=(source, 0) if source else None)
        decoder = FrameDecoder()
        messages: list = []
        while not messages:
            data = sock.recv(65536)
            assert data, "closed without a frame"
            messages = decoder.feed(data)
        out.append((sock, decoder, messages[0]))
    return out


def test_idle_strangers_cannot_lock_clients_out(tmp_service):
    """200 connections that never say Hello (64 kept every client out as long as they reconnected):
    the oldest idle ones make room, so clients on TCP connect at their first try."""
    # no Hello timeout during the test (a loaded machine): the strangers stay until made room for
    svc = tmp_service(conf={"helloTimeout": "600"})
    config = ExchangeConfig()
    strangers = []
    for _round in range(2):  # and again, as strangers that reconnect would
        strangers += _strangers(svc, 200)
        time.sleep(1.0)  # every one admitted is idle by now (a tenth of helloTimeout, at most 1 s)
        for _ in range(5):
            _healthy(svc)  # no retry: admitted at once, an idle stranger closed for it
        with svc.connect(svc.unix) as conn:
            assert conn.call("ping")["service_id"]
    assert svc.status()["strangers"] <= config.max_unauthenticated_per_peer
    evicted = 0
    for sock, decoder, first in strangers:
        if isinstance(first, ErrorResponse):  # refused: the cap was full of strangers younger than idle
            assert first.fatal and "try again" in first.message
            sock.close()
            continue
        assert isinstance(first, ServerHello)
        try:
            error = _next_error(sock, decoder, timeout=0.01)
        except socket.timeout:
            continue  # still held
        finally:
            sock.close()
        assert error.fatal
        if "a newer connection took this one's place" in error.message:
            assert error.code == "too_many_connections" and "maxUnauthenticatedPerPeer=" in error.message
            evicted += 1
        else:
            raise AssertionError(error.message)
    assert evicted >= 10  # at least one for each client above: the peer's cap was full of idle strangers


def test_own_unix_clients_never_wait_behind_strangers(tmp_service):
    """A full cap of fresh strangers refuses a TCP newcomer, never this user's client on the Unix socket."""
    svc = tmp_service(conf={"maxUnauthenticatedConnections": "4", "helloTimeout": "600"})
    strangers = _strangers(svc, 4)
    with pytest.raises(ServiceError, match="maxUnauthenticatedConnections=4"):
        svc.connect()
    held = [svc.connect(svc.unix) for _ in range(8)]  # counted with no stranger, closing none
    for conn in held:
        assert conn.call("ping")["service_id"]
    assert held[0].call("status")["strangers"] == 4
    for conn in held:
        conn.close()
    for sock, _decoder, _first in strangers:
        sock.close()


def test_strangers_of_one_peer_cannot_crowd_out_another(tmp_service):
    """A peer's strangers are capped on their own: a flood from 127.0.0.2 leaves room for 127.0.0.1."""
    svc = tmp_service(conf={"maxUnauthenticatedConnections": "8", "maxUnauthenticatedPerPeer": "3",
                            "helloTimeout": "600"})
    strangers = _strangers(svc, 3, source="127.0.0.2")
    refused, _decoder, error = _strangers(svc, 1, source="127.0.0.2")[0]
    assert isinstance(error, ErrorResponse) and error.fatal and "from 127.0.0.2" in error.message and "maxUnauthenticatedPerPeer=3" in error.message
    _healthy(svc)  # from 127.0.0.1
    for sock, _decoder, _first in strangers:
        sock.close()
    refused.close()


def test_total_connections_are_capped(tmp_service):
    svc = tmp_service(conf={"maxConnections": "3"})
    held = [svc.connect() for _ in range(3)]
    with pytest.raises(ServiceError, match="maxConnections=3"):
        svc.connect()
    held.pop().close()
    _healthy_again(svc)
    for conn in held:
        conn.close()


class FakeService:
    """A listener on loopback that greets like a service but answers Hello as told (it knows no secret)."""

    def __init__(self, answer) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(10)
        for _ in range(2):  # one blocking client, one asyncio client
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                nonce = "5e" * 16  # a service's nonce: 32 hex digits
                conn.sendall(encode_bytes(ServerHello(nonce, "fake", "fake-host")))
                decoder = FrameDecoder()
                hello = None
                while hello is None:
                    data = conn.recv(65536)
                    if not data:
                        break
                    hello = next((m for m in decoder.feed(data) if isinstance(m, Hello)), None)
                if hello is not None:
                    for msg in self.answer(hello, nonce):
                        conn.sendall(encode_bytes(msg))
                    try:
                        conn.recv(65536)  # until the client hangs up
                    except OSError:
                        pass

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("answer, message", [
    (lambda hello, nonce: [Welcome("fake", "fake-host")], "did not prove that it knows the shared secret"),
    (lambda hello, nonce: [Welcome("fake", "fake-host", auth.prove_service("guess", hello.nonce, nonce, "fake"))],
     "wrong secret proof"),
    # replaying the client's own proof as the service's must not work either
    (lambda hello, nonce: [Welcome("fake", "fake-host", hello.proof)], "wrong secret proof"),
], ids=["no-proof", "wrong-secret", "reflected-proof"])
def test_the_client_checks_the_service(answer, message):
    fake = FakeService(answer)
    try:
        start = time.monotonic()
        with pytest.raises(ServiceError, match=message):
            BlockingConnection(fake.address, "the-secret", timeout=5)
        with pytest.raises(ServiceError, match=message):
            asyncio.run(open_connection(fake.address, "the-secret", timeout=5))
        assert time.monotonic() - start < 10
    finally:
        fake.close()


def test_a_second_server_hello_is_a_protocol_error():
    def answer(hello, nonce):
        return [Welcome("fake", "fake-host", auth.prove_service("the-secret", hello.nonce, nonce, "fake")),
                ServerHello("again", "fake", "fake-host")]

    fake = FakeService(answer)
    try:
        conn = BlockingConnection(fake.address, "the-secret", timeout=5)  # the proof was right
        with pytest.raises(ServiceError, match="second ServerHello"):
            conn.recv(5)

        async def asyncio_client():
            c = await open_connection(fake.address, "the-secret", timeout=5)
            for _ in range(100):
                if c.lost_reason:
                    return c.lost_reason
                await asyncio.sleep(0.05)
            return None

        assert "second ServerHello" in (asyncio.run(asyncio_client()) or "")
    finally:
        fake.close()


def _certificate(tmp_path, name: str, san: str | None):
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    args = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
            "-days", "1", "-subj", f"/CN={name}"]
    if san:
        args += ["-addext", f"subjectAltName={san}"]
    subprocess.run(args, check=True, capture_output=True)
    return cert, key


def test_tls_checks_the_host_name_unless_told_not_to(tmp_service, tmp_path):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl CLI not available")
    cert, key = _certificate(tmp_path, "elsewhere", "DNS:elsewhere.example")  # names another host
    svc = tmp_service(conf={"tls.certFile": str(cert), "tls.keyFile": str(key)})
    strict = client_config(svc, **{"tls.caFile": str(cert)})
    with pytest.raises(ServiceError, match="failed TLS verification.*tls.checkHostname=false"):
        BlockingConnection(svc.tcp, svc.secret, timeout=5, ssl_ctx=auth.ssl_for(svc.tcp, strict))
    with pytest.raises(ServiceError, match="failed TLS verification"):
        asyncio.run(open_connection(svc.tcp, svc.secret, timeout=5, ssl_ctx=auth.ssl_for(svc.tcp, strict)))
    relaxed = client_config(svc, **{"tls.caFile": str(cert), "tls.checkHostname": "false"})
    with BlockingConnection(svc.tcp, svc.secret, timeout=5, ssl_ctx=auth.ssl_for(svc.tcp, relaxed)) as conn:
        assert conn.call("ping")["tls"] is True


def test_admission_makes_room_only_from_idle_strangers():
    """The rules without sockets: caps per peer and in all; the oldest idle stranger in the full cap's scope
    makes room; a cap full of fresh ones refuses; this user's Unix clients count only towards the total."""
    from sparkflow_exchange.network.admission import Admission

    now = [0.0]
    adm = Admission(max_connections=6, max_strangers=3, max_per_peer=2, hello_timeout=10.0, clock=lambda: now[0])
    assert adm.idle_after == 1.0
    assert adm.admit("a1", "A", False).refusal is None
    assert adm.admit("a2", "A", False).refusal is None
    assert "maxUnauthenticatedPerPeer=2" in adm.admit("a3", "A", False).refusal  # both fresh
    assert adm.admit("b1", "B", False).refusal is None
    assert "maxUnauthenticatedConnections=3" in adm.admit("c1", "C", False).refusal
    for own in ("own", "own2"):  # admitted, nothing closed
        verdict = adm.admit(own, "uid 0", True)
        assert verdict.refusal is None and not verdict.evict
    now[0] = 1.5  # a1, a2, b1 are idle now
    verdict = adm.admit("b2", "B", False)  # the cap in all is full: the oldest of anyone's goes
    assert verdict.refusal is None and [c for c, _ in verdict.evict] == ["a1"]
    verdict = adm.admit("b3", "B", False)  # B's own cap is full: B's oldest goes, not A's
    assert verdict.refusal is None and [c for c, _ in verdict.evict] == ["b1"]
    assert "maxUnauthenticatedPerPeer=2" in verdict.evict[0][1]
    adm.authenticated("b2")
    adm.discharge("a2")
    assert adm.strangers == 1 and adm.connections == {"own", "own2", "b2", "b3"}
    adm.admit("x", "X", False)
    adm.admit("y", "Y", False)
    assert "maxConnections=6" in adm.admit("own3", "uid 0", True).refusal  # the total binds everyone...
    now[0] = 3.0
    verdict = adm.admit("own3", "uid 0", True)  # ...but an idle stranger makes room for our own user
    assert verdict.refusal is None and [c for c, _ in verdict.evict] == ["b3"]


def test_clients_ask_again_while_the_service_has_no_room(tmp_service):
    """A client refused for want of room (code too_many_connections) asks again within its timeout: it
    gets in as soon as a place frees, on the blocking path (writers, RPCs) and on the IO thread's."""
    from sparkflow_exchange.network.aio_client import rpc_once
    from sparkflow_exchange.service.discovery import Endpoints

    svc = tmp_service(conf={"maxUnauthenticatedConnections": "2", "helloTimeout": "600"})
    own = svc.connect(svc.unix)  # this user's: never refused for strangers

    def refused() -> int:
        return own.call("status")["refused_connections"]

    config = client_config(svc)
    endpoints = Endpoints(svc.tcp, svc.tcp, svc.secret, "")
    for attempt in ("blocking", "asyncio"):
        strangers = _strangers(svc, 2)  # fresh, never idle: the cap refuses every newcomer
        refusals = refused()
        result: dict = {}

        def client(attempt: str, result: dict) -> None:
            try:
                if attempt == "blocking":
                    with endpoints.connect(svc.tcp, config, timeout=60) as conn:
                        result["ping"] = conn.call("ping")
                else:
                    result["ping"] = asyncio.run(rpc_once(svc.tcp, svc.secret, config, "ping", {}))
            except Exception as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        thread = threading.Thread(target=client, args=(attempt, result))
        thread.start()
        deadline = time.monotonic() + 60
        while refused() == refusals:  # refused once at least
            assert time.monotonic() < deadline and thread.is_alive(), result
            time.sleep(0.05)
        strangers[0][0].close()  # a place frees
        thread.join(60)
        assert "error" not in result and result["ping"]["service_id"], result
        for sock, _decoder, _first in strangers[1:]:
            sock.close()
        _healthy_again(svc)
    own.close()


def test_strangers_that_never_start_tls_are_capped_and_make_room(tmp_service, tmp_path):
    """On a TLS port a stranger is a handshake before it is a connection: 200 that never start TLS hold
    at most maxUnauthenticatedConnections fds, and the oldest idle ones make room for a client."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl CLI not available")
    cert, key = _certificate(tmp_path, "loopback", "IP:127.0.0.1")
    svc = tmp_service(conf={"tls.certFile": str(cert), "tls.keyFile": str(key),
                            "maxUnauthenticatedConnections": "8", "helloTimeout": "60"})  # slow machines
    def fds() -> int:
        return fd_count(svc.proc.pid)

    with svc.connect(svc.unix) as conn:  # whatever the service opens on its first call is counted before
        assert conn.call("ping")["service_id"]
    fds_before = _settled(fds)
    host, port = svc.tcp.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(200)]
    for _ in range(5):  # each a few turns of the service's loop, each turn accepts 64: all were taken in
        with svc.connect(svc.unix) as conn:
            assert conn.call("ping")["service_id"]
    # the pings' own connections close a turn of the loop later: what stays is what the strangers hold
    assert _settled(fds) <= fds_before + 8
    time.sleep(1.0)  # every one held is idle now (a tenth of helloTimeout, at most 1 s)
    tls = client_config(svc, **{"tls.caFile": str(cert)})
    with BlockingConnection(svc.tcp, svc.secret, timeout=10, ssl_ctx=auth.ssl_for(svc.tcp, tls)) as conn:
        assert conn.call("ping")["tls"] is True  # at its first try
    for sock in silent:
        sock.close()


def _settled(count, seconds: float = 10.0) -> int:
    """The least of a count read every 50 ms until it stops falling for half a second (or `seconds` pass):
    connections a service closes finish closing a turn of its loop later, on a loaded machine later still."""
    deadline = time.monotonic() + seconds
    least, since = count(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 0.5:
        time.sleep(0.05)
        now = count()
        if now < least:
            least, since = now, time.monotonic()
    return least


def _hand_framed(kind: MsgType, header: bytes) -> bytes:
    return PREFIX.pack(PREFIX.size - 4 + len(header), MAGIC, VERSION, kind, len(header)) + header


@pytest.mark.parametrize("nest, depth", [("[", 1500), ('{"":', 650)], ids=["lists", "objects"])
def test_a_deeply_nested_hello_is_refused_before_it_is_parsed(tmp_service, nest, depth):
    """A Hello whose JSON nests 1,500 lists deep (it fits the pre-authentication frame size) is refused
    with a clear protocol error, not a RecursionError traceback in the service's log."""
    svc = tmp_service()
    close = "]" if nest == "[" else "}"
    header = ('{"client_id": ' + nest * depth + "1" + close * depth + ', "proof": ""}').encode()
    assert len(header) < PREAUTH_MAX_FRAME
    sock, decoder, _hello = _connect_raw(svc)
    sock.sendall(_hand_framed(MsgType.HELLO, header))
    error = _next_error(sock, decoder)
    assert error.fatal and error.code == "protocol" and "nests deeper than" in error.message, error.message
    sock.close()
    _healthy(svc)
    log = (svc.home / "service.log").read_text()
    assert "RecursionError" not in log and "Traceback" not in log, log[-3000:]


def test_a_shallow_hello_with_many_brackets_in_its_strings_is_served(tmp_service):
    """Brackets inside strings do not count as nesting: a client id full of them is just a name."""
    svc = tmp_service()
    header = json.dumps({"client_id": "[{" * 600, "proof": "x"}).encode()
    assert len(header) < PREAUTH_MAX_FRAME
    sock, decoder, _hello = _connect_raw(svc)
    sock.sendall(_hand_framed(MsgType.HELLO, header))
    error = _next_error(sock, decoder)
    assert error.fatal and "nests deeper" not in error.message and "authentication failed" in error.message, \
        error.message
    sock.close()
