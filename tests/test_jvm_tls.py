"""The jar speaks TLS as the Python client does (jvm-stub/.../wire/Tls.java, RpcConnection.java).

A few lines of Java (no Spark application, seconds) open ``RpcConnection``s with TLS settings to real services with
TLS on loopback: the CA file trusted and a certificate naming 127.0.0.1 serve; a Unix socket stays plaintext; a
wrong CA, or a certificate naming another address, fail verification in the Python client's words (unless
``tls.checkHostname=false``, which trusts the CA alone). Then one Spark application (tests/app_jvm_tls.py) writes
and reads through ``format("pipelined")`` and the catalog over TLS in the JVM: no Exchange after the read for a
``groupBy`` on the key, every row exact, the reads over TCP. Builds the plugin jar; the application takes 25-45 s on
a busy 2-core machine.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import start_service

from sparkflow_exchange.errors import ServiceError
from sparkflow_exchange.network.auth import client_ssl_context
from sparkflow_exchange.network.blocking_client import BlockingConnection

PROBE = """
import org.sparkflow.exchange.wire.RpcConnection;
import org.sparkflow.exchange.wire.Tls;
import java.util.Map;

public class Probe {
    public static void main(String[] args) {
        Tls tls = args[2].isEmpty() ? null : new Tls(args[2], null, Boolean.parseBoolean(args[3]));
        try (RpcConnection conn = new RpcConnection(args[0], args[1], "jvm-host", 10_000, tls)) {
            System.out.println("served " + conn.call("ping", Map.of()).path("service_id").asText());
        } catch (RuntimeException e) {
            // the message without the marker that names the package's class (checked in test_error_vocabulary)
            System.out.println("refused " + (e instanceof org.sparkflow.exchange.errors.ExchangeError x
                    ? x.detail() : e.getMessage()));
        }
    }
}
"""


def make_cert(directory: Path, name: str, san: str) -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) whose subjectAltName is ``san``, and its key."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def tls_setup(tmp_path_factory):
    """A TLS service whose certificate names 127.0.0.1, one whose certificate names other addresses only, and a
    certificate of another CA."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available")
    tmp = tmp_path_factory.mktemp("jvm-tls")
    cert, key = make_cert(tmp, "service", "IP:127.0.0.1")
    misnamed_cert, misnamed_key = make_cert(tmp, "misnamed", "IP:127.0.0.2,DNS:elsewhere.invalid")
    other_ca, _ = make_cert(tmp, "other", "IP:127.0.0.1")
    svc = start_service(tmp / "svc", conf={"tls.certFile": str(cert), "tls.keyFile": str(key)})
    misnamed = start_service(tmp / "misnamed-svc", conf={"tls.certFile": str(misnamed_cert),
                                                         "tls.keyFile": str(misnamed_key)})
    try:
        assert svc.info["tls"] is True and misnamed.info["tls"] is True
        yield {"svc": svc, "misnamed": misnamed, "ca": cert, "misnamed_cert": misnamed_cert, "other_ca": other_ca,
               "tmp": tmp}
    finally:
        svc.stop()
        misnamed.stop()


@pytest.fixture(scope="module")
def probe(jar, tmp_path_factory):
    from sparkflow_exchange.build_plugin import spark_jars

    if shutil.which("java") is None or shutil.which("javac") is None:
        pytest.skip("java/javac are not on PATH")
    work = tmp_path_factory.mktemp("jvm-tls-probe")
    (work / "Probe.java").write_text(PROBE)
    classpath = ":".join([str(jar), *(str(p) for p in spark_jars())])
    compiled = subprocess.run(["javac", "-nowarn", "-cp", classpath, "-d", str(work), str(work / "Probe.java")],
                              capture_output=True, text=True, timeout=300)  # once: each run then only starts a JVM
    assert compiled.returncode == 0, compiled.stderr[-3000:]

    def run(address: str, secret: str, ca: Path | None, check_hostname: bool = True) -> str:
        out = subprocess.run(["java", "-cp", f"{work}:{classpath}", "Probe", address, secret,
                              str(ca or ""), str(check_hostname).lower()], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]
    return run


def python_refusal(address: str, secret: str, ca: Path) -> str:
    with pytest.raises(ServiceError) as caught:
        BlockingConnection(address, secret, timeout=10, ssl_ctx=client_ssl_context(str(ca))).close()
    return str(caught.value)


def test_the_jvm_speaks_tls_to_a_service_whose_certificate_names_the_address(probe, tls_setup):
    svc = tls_setup["svc"]
    assert probe(svc.tcp, svc.secret, tls_setup["ca"]) == f"served {svc.info['service_id']}"


def test_a_unix_socket_stays_plaintext_with_tls_configured(probe, tls_setup):
    svc = tls_setup["svc"]
    assert probe(svc.unix, svc.secret, tls_setup["ca"]) == f"served {svc.info['service_id']}"


def test_a_plaintext_jvm_client_of_a_tls_port_is_told_to_set_the_ca(probe, tls_setup):
    svc = tls_setup["svc"]
    answer = probe(svc.tcp, svc.secret, None)
    assert answer == (f"refused the exchange service at {svc.tcp} closed the connection before the handshake "
                      "finished (is it a TLS port? then set tls.caFile)"), answer


def test_a_wrong_ca_fails_verification_in_the_python_clients_words(probe, tls_setup):
    svc = tls_setup["svc"]
    answer = probe(svc.tcp, svc.secret, tls_setup["other_ca"])
    assert answer.startswith(f"refused the exchange service at {svc.tcp} failed TLS verification: "), answer
    assert "unknown CA" in answer and f"tls.caFile {tls_setup['other_ca']}" in answer, answer
    python = python_refusal(svc.tcp, svc.secret, tls_setup["other_ca"])
    assert f"the exchange service at {svc.tcp} failed TLS verification: " in python
    assert python.split("(")[-1] == answer.split("(")[-1]  # the same advice


def test_a_certificate_not_naming_the_address_fails_unless_the_host_name_check_is_off(probe, tls_setup):
    misnamed = tls_setup["misnamed"]
    answer = probe(misnamed.tcp, misnamed.secret, tls_setup["misnamed_cert"])
    assert answer.startswith(f"refused the exchange service at {misnamed.tcp} failed TLS verification: "), answer
    assert "certificate is not valid for '127.0.0.1'" in answer and "subjectAltName" in answer, answer
    python = python_refusal(misnamed.tcp, misnamed.secret, tls_setup["misnamed_cert"])
    assert "certificate is not valid for '127.0.0.1'" in python
    assert probe(misnamed.tcp, misnamed.secret, tls_setup["misnamed_cert"], check_hostname=False) \
        == f"served {misnamed.info['service_id']}"


def test_a_missing_ca_file_is_named(probe, tls_setup):
    svc = tls_setup["svc"]
    missing = tls_setup["tmp"] / "no-such-ca.pem"
    assert probe(svc.tcp, svc.secret, missing) == f"refused tls.caFile {missing} does not exist"


@pytest.mark.spark
@pytest.mark.cluster
def test_format_pipelined_and_the_catalog_run_in_the_jvm_over_tls(jar, tls_setup, tmp_path):
    from conftest import run_app_with_jar

    svc, misnamed = tls_setup["svc"], tls_setup["misnamed"]
    setup = {"tcp": svc.tcp, "secret": svc.secret, "ca": str(tls_setup["ca"]), "other_ca": str(tls_setup["other_ca"]),
             "misnamed_tcp": misnamed.tcp, "misnamed_cert": str(tls_setup["misnamed_cert"])}
    source = (Path(__file__).parent / "app_jvm_tls.py").read_text().replace(
        "setup = json.loads(sys.argv[2])", f"setup = json.loads({json.dumps(json.dumps(setup))})")
    before = svc.connect(svc.unix).call("status")["traffic"]
    results, _ = run_app_with_jar(tmp_path, source, jar, timeout=600)
    after = svc.connect(svc.unix).call("status")["traffic"]

    def passed(name: str) -> dict:
        outcome = results[name]
        assert outcome["ok"], f"{name}: {outcome.get('error')}\n{outcome.get('trace', '')}"
        return outcome

    # the reads took every row from the service over TCP (TLS: its only TCP port), none from its spill files
    assert after["remote"] > before["remote"] and after["local_file"] == before["local_file"], (before, after)
    passed("format_pipelined_over_tls_is_served_by_the_jvm")
    passed("catalog_over_tls_writes_and_reads_in_the_jvm")
    assert passed("without_the_host_name_check_the_ca_alone_is_trusted")["tables"] == []
    print(json.dumps({k: v.get("error", "").splitlines()[:2] for k, v in results.items()}))  # shown on a failure
    wrong_ca = results["a_wrong_ca_fails_verification"]
    assert not wrong_ca["ok"] and "failed TLS verification" in wrong_ca["error"] \
        and "unknown CA" in wrong_ca["error"], wrong_ca
    wrong_name = results["a_certificate_not_naming_the_address_fails_verification"]
    assert not wrong_name["ok"] and "failed TLS verification" in wrong_name["error"] \
        and "certificate is not valid for '127.0.0.1'" in wrong_name["error"], wrong_name
