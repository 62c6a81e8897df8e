"""The JVM's handshake (jvm-stub/.../wire/Handshake.java) and the Python service agree byte for byte.

A few lines of Java, run with the plugin jar and Spark's jars on the class path (no Spark application, a
second or two), open ``RpcConnection``s to a real Python service: with the operator's secret and an
application credential they are served (ping, and the credential the service saw), with a wrong secret
they are refused, and a service that relays another's proof is not trusted. So a change to the proofs on
one side only fails here.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness import start_service

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


def test_the_jvm_distrusts_a_service_whose_proof_names_another_service(probe, tmp_path):
    """A listener that greets as one service and answers with the proof the real service made for itself
    (a relay that rewrote the greeting's service id) is not trusted by the JVM either."""
    import socket
    import threading

    from sparkflow_exchange.network import auth
    from sparkflow_exchange.network.protocol import FrameDecoder, Hello, ServerHello, Welcome, encode_bytes

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(60)
    nonce = "ab" * 16

    def serve() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.sendall(encode_bytes(ServerHello(nonce, "svc-claimed", "h")))
            decoder, hello = FrameDecoder(), None
            while hello is None:
                data = conn.recv(65536)
                if not data:
                    return
                hello = next((m for m in decoder.feed(data) if isinstance(m, Hello)), None)
            # the proof a service named "svc-real" would send on this connection
            conn.sendall(encode_bytes(Welcome("svc-real", "h", auth.prove_service("s3cret", hello.nonce, nonce,
                                                                                  "svc-real"))))
            conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        answer = probe("127.0.0.1:%d" % server.getsockname()[1], "s3cret")
        assert answer.startswith("refused") and "not trusted" in answer
    finally:
        server.close()
        thread.join(5)
