"""What a client that never authenticates can cost a service stays flat, on a TLS port and on the metrics port.

A flood of idle TLS connections, each reopened every 0.3 s (so none is ever old enough to make room by age),
must not keep a legitimate client out: idle connections that never started TLS wait apart from handshakes
that started, and are dropped oldest first for a newcomer; a handshake has a deadline; a client whose
connection was refused or cut before TLS finished asks again with backoff, as it does in plaintext. The
unauthenticated metrics port has a deadline for a whole request and a small cap of its own, so slow
clients can neither hold its connections for good nor take the service's file descriptors.
"""
from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time

import pytest
from harness import client_config, fd_count

from sparkflow_exchange.network.aio_client import rpc_once
from sparkflow_exchange.service.discovery import Endpoints

FLOOD = 300
REOPEN = 0.3  # s each flood connection lives before it is closed and opened again


def _certificate(tmp_path):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl CLI not available")
    cert, key = tmp_path / "loopback.pem", tmp_path / "loopback.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=loopback", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


class Flood:
    """``FLOOD`` idle TCP connections to ``address`` (never a byte sent), each reopened every ``REOPEN`` s, from
    a thread of its own, until stopped (at most ``limit`` s)."""

    def __init__(self, address: str, limit: float = 60.0) -> None:
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.limit = limit
        self.stop = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Flood":
        self.thread.start()
        deadline = time.monotonic() + 10
        while self.opened < 2 * FLOOD and time.monotonic() < deadline:  # the flood is on: a round reopened
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        socks: list[tuple[float, socket.socket]] = []
        end = time.monotonic() + self.limit
        while not self.stop.is_set() and time.monotonic() < end:
            now = time.monotonic()
            while socks and now - socks[0][0] >= REOPEN:
                socks.pop(0)[1].close()
            while len(socks) < FLOOD:
                sock = socket.socket()
                sock.setblocking(False)
                try:
                    sock.connect(self.target)
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    break
                socks.append((time.monotonic(), sock))
                self.opened += 1
            time.sleep(0.01)
        for _, sock in socks:
            sock.close()


def test_a_client_gets_in_while_idle_tls_connections_keep_reconnecting(tmp_service, tmp_path):
    cert, key = _certificate(tmp_path)
    svc = tmp_service(conf={"tls.certFile": str(cert), "tls.keyFile": str(key)})
    config = client_config(svc, **{"tls.caFile": str(cert)})
    endpoints = Endpoints(svc.tcp, svc.tcp, svc.secret, "")
    failures: list[str] = []
    with Flood(svc.tcp):
        start = time.monotonic()
        for _ in range(10):  # blocking clients (writers, RPCs)
            try:
                with endpoints.connect(svc.tcp, config, timeout=30) as conn:
                    assert conn.call("ping")["tls"] is True
            except Exception as exc:  # noqa: BLE001 - counted, shown below
                failures.append(f"blocking: {exc}")
        for _ in range(3):  # the IO thread's clients (readers, the coordinator's releases)
            try:
                assert asyncio.run(rpc_once(svc.tcp, svc.secret, config, "ping", {}))["tls"] is True
            except Exception as exc:  # noqa: BLE001
                failures.append(f"asyncio: {exc}")
        took = time.monotonic() - start
    assert failures == [], failures
    assert took < 30, took
    with svc.connect(svc.unix) as conn:  # the flood is gone: nothing of it is held
        assert conn.call("status")["strangers"] == 0


def _slow_handshakes(address: str, count: int) -> list[socket.socket]:
    """Connections that start a TLS handshake (part of a record header) and say no more."""
    host, port = address.rsplit(":", 1)
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"\x16\x03\x01")  # a handshake record begins...
        socks.append(sock)
    return socks


@pytest.mark.parametrize("path", ["blocking", "asyncio"])
def test_a_tls_client_cut_for_want_of_room_asks_again(tmp_service, tmp_path, path):
    """Every place for a handshake is taken by one that just started: the service closes a newcomer before TLS,
    and the client, seeing its handshake cut, asks again with backoff until a place frees."""
    cert, key = _certificate(tmp_path)
    svc = tmp_service(conf={"tls.certFile": str(cert), "tls.keyFile": str(key),
                            "maxUnauthenticatedConnections": "2", "helloTimeout": "600"})
    config = client_config(svc, **{"tls.caFile": str(cert)})
    own = svc.connect(svc.unix)

    def refused() -> int:
        return own.call("status")["refused_connections"]

    before = refused()
    slow = _slow_handshakes(svc.tcp, 2)
    result: dict = {}

    def client() -> None:
        try:
            if path == "blocking":
                with Endpoints(svc.tcp, svc.tcp, svc.secret, "").connect(svc.tcp, config, timeout=60) as conn:
                    result["ping"] = conn.call("ping")
            else:
                result["ping"] = asyncio.run(rpc_once(svc.tcp, svc.secret, config, "ping", {}))
        except Exception as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    thread = threading.Thread(target=client)
    thread.start()
    deadline = time.monotonic() + 30
    while refused() == before:  # cut once at least
        assert time.monotonic() < deadline and thread.is_alive(), result
        time.sleep(0.02)
    slow[0].close()  # a place frees (or the slow ones grow old enough to make room)
    thread.join(60)
    assert "error" not in result and result["ping"]["tls"] is True, result
    for sock in slow:
        sock.close()
    own.close()


# ------------------------------------------------------------------ the metrics port
def _metrics_address(svc) -> tuple[str, int]:
    port = svc.info["metrics_port"]
    assert port, svc.info
    return "127.0.0.1", port


def _scrape(svc, timeout: float = 10.0) -> bytes:
    with socket.create_connection(_metrics_address(svc), timeout=timeout) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                return b"".join(chunks)
            chunks.append(data)


def _closed_within(sock: socket.socket, seconds: float, trickle: bool) -> bool:
    """Whether the service closes ``sock`` within ``seconds`` while it sends a header line every 0.2 s."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(b"X-Slow: 1\r\n")
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:  # reset: closed as well
            return True
    return False


def test_a_metrics_request_has_one_deadline_for_the_whole_request(tmp_service):
    svc = tmp_service(conf={"metricsTimeout": "1"}, extra=["--metrics"])
    slow = socket.create_connection(_metrics_address(svc), timeout=10)
    slow.sendall(b"GET /metrics HTTP/1.1\r\n")
    start = time.monotonic()
    assert _closed_within(slow, 5.0, trickle=True), "a client sending a header line now and then was never cut"
    assert time.monotonic() - start < 3.0
    slow.close()
    assert b"sparkflow_connections" in _scrape(svc)


def test_slow_metrics_clients_cannot_take_the_services_descriptors(tmp_service):
    """300 clients that trickle headers to the metrics port of a service with 256 fds: the port serves a few
    at once (its own cap), the operator still connects to the service, and a scrape still gets through."""
    svc = tmp_service(conf={"metricsTimeout": "30", "metricsMaxConnections": "8"}, extra=["--metrics"], nofile=256)
    fds_before = fd_count(svc.proc.pid)
    slow = []
    for _ in range(300):
        try:
            sock = socket.create_connection(_metrics_address(svc), timeout=10)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            slow.append(sock)
        except OSError:
            break
    try:
        assert len(slow) == 300
        deadline = time.monotonic() + 30  # a bound for a loaded machine, not a pace
        while fd_count(svc.proc.pid) > fds_before + 8 + 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # the accept loop has taken every one in and closed what exceeds the cap
        assert fd_count(svc.proc.pid) <= fds_before + 8 + 2
        with svc.connect() as conn:  # the operator, over TCP: not out of descriptors
            assert conn.call("ping")["service_id"]
        time.sleep(1.1)  # the slow ones held are old now: a newcomer takes the oldest one's place
        assert b"sparkflow_connections" in _scrape(svc)
    finally:
        for sock in slow:
            sock.close()
