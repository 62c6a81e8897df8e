"""The JVM's handshake (jvm-stub/.../wire/Handshake.java) and the Python service agree byte for byte.

A few lines of Java, run with the plugin jar and Spark's jars on the class path (no Spark application, a
few seconds), open ``RpcConnection``s to a real Python service: with the operator's secret and an
application credential they are served, with a wrong secret they are refused. Against a hand-framed fake
service, the JVM's proof is the one Python computes for the connection, a proof made for another service
is not trusted, and a nonce that could shift a field is refused. So a change to the proofs on one side
only fails here.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import pytest
from harness import start_service

from sparkflow_exchange.network import auth
from sparkflow_exchange.network.protocol import FrameDecoder, Hello, ServerHello, Welcome, encode_bytes

PROBE = """
import org.sparkflow.exchange.wire.RpcConnection;
import java.util.Map;

public class Probe {
    public static void main(String[] args) {
        try (RpcConnection conn = new RpcConnection(args[0], args[1], "jvm-host", 10_000)) {
            System.out.println("served " + conn.call("ping", Map.of()).path("service_id").asText());
        } catch (RuntimeException e) {
            System.out.println("refused " + e.getMessage());
        }
    }
}
"""


@pytest.fixture(scope="module")
def probe(jar, tmp_path_factory):
    from sparkflow_exchange.build_plugin import spark_jars

    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    work = tmp_path_factory.mktemp("jvm-probe")
    (work / "Probe.java").write_text(PROBE)
    classpath = ":".join([str(jar), *(str(p) for p in spark_jars())])

    def run(address: str, secret: str) -> str:
        out = subprocess.run(["java", "-cp", classpath, str(work / "Probe.java"), address, secret],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]
    return run


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jvm-handshake")
    creds = tmp / "credentials"
    creds.write_text("alice alice-secret-0123456789\n")
    creds.chmod(0o600)
    svc = start_service(tmp / "svc", conf={"credentialsFile": str(creds)})
    yield svc
    svc.stop()


def test_the_jvm_proves_the_operator_secret_and_a_credential_to_the_python_service(probe, service):
    sid = service.info["service_id"]
    assert probe(service.tcp, service.secret) == f"served {sid}"
    assert probe(service.unix, service.secret) == f"served {sid}"
    assert probe(service.tcp, "alice-secret-0123456789") == f"served {sid}"


def test_the_jvm_is_refused_with_a_wrong_secret(probe, service):
    answer = probe(service.tcp, "not-the-secret")
    assert answer.startswith("refused") and "wrong secret" in answer


class FakeService:
    """A listener on loopback that greets with ``nonce`` as ``greets_as`` and answers the Hello with the proof a
    service named ``proves_as`` would make on this connection (it knows the secret ``s3cret``)."""

    def __init__(self, nonce: str, greets_as: str, proves_as: str) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(60)
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.nonce, self.greets_as, self.proves_as = nonce, greets_as, proves_as
        self.hellos: list[Hello] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            conn.sendall(encode_bytes(ServerHello(self.nonce, self.greets_as, "h")))
            decoder, hello = FrameDecoder(), None
            while hello is None:
                data = conn.recv(65536)
                if not data:
                    return
                hello = next((m for m in decoder.feed(data) if isinstance(m, Hello)), None)
            self.hellos.append(hello)
            proof = auth.prove_service("s3cret", hello.nonce, self.nonce, self.proves_as)
            conn.sendall(encode_bytes(Welcome(self.proves_as, "h", proof)))
            try:
                conn.recv(65536)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        self.thread.join(5)


def test_the_jvm_proves_for_the_service_that_greets_and_checks_its_proof(probe):
    """The JVM's proof is the one the Python side computes for this connection and the greeting's service; a
    proof made for another service (a relay that rewrote the greeting's id) is not trusted."""
    honest = FakeService("ab" * 16, "svc-real", "svc-real")
    try:
        assert probe(honest.address, "s3cret").startswith("refused")  # the fake answers no ping, but...
        [hello] = honest.hellos
        assert auth.valid_nonce(hello.nonce)
        assert hello.proof == auth.prove("s3cret", "ab" * 16, hello.nonce, "svc-real")  # ...proved as Python does
    finally:
        honest.close()
    relay = FakeService("ab" * 16, "svc-claimed", "svc-real")
    try:
        answer = probe(relay.address, "s3cret")
        assert answer.startswith("refused") and "not trusted" in answer
    finally:
        relay.close()


def test_the_jvm_refuses_a_nonce_that_could_shift_a_field(probe):
    fake = FakeService("ab" * 15 + ":x", "svc-real", "svc-real")
    try:
        answer = probe(fake.address, "s3cret")
        assert answer.startswith("refused") and "not 32 lowercase hex digits" in answer and fake.hellos == []
    finally:
        fake.close()
