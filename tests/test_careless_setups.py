"""Careless set-ups end in one line naming the file and the cause, never a traceback and never silently:
what `serve --unix` may replace, TLS half configured, `--insecure` beyond loopback, secret and credentials
files others may read, empty, missing or not files, and an unsafe runtime directory under the CLI."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT_CAN_READ_ANYTHING = os.geteuid() == 0


def _env(tmp_path: Path) -> dict[str, str]:
    """This test's own runtime directory and no spark-defaults.conf: nothing of other services is seen."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME", "SPARKFLOW_EXCHANGE_CONF")}
    return {**env, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}


class Outcome:
    def __init__(self, started: bool, returncode: int | None, stderr: str) -> None:
        self.started, self.returncode, self.stderr = started, returncode, stderr

    def refused(self, *parts: str) -> None:
        """It did not start, and said so in one line holding every part."""
        assert not self.started, f"the service started: {self.stderr[-2000:]}"
        assert self.returncode != 0
        assert "Traceback" not in self.stderr, self.stderr[-3000:]
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, self.stderr[-3000:]
        for part in parts:
            assert part in lines[0], lines[0]


def serve(tmp_path: Path, *args: str, secret: str | None = "operator-secret-0123") -> Outcome:
    """``sparkflow-exchange serve`` with ``args``: whether it started (printed its addresses; it is then
    stopped at once), else its exit code and stderr."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    spill = tmp_path / "spill"
    argv = [sys.executable, "-m", "sparkflow_exchange.cli", "serve", "--port", "0", "--spill-dir", str(spill), *args]
    if secret is not None and "--secret-file" not in args:
        path = tmp_path / "operator-secret"
        path.write_text(secret)
        path.chmod(0o600)
        argv += ["--secret-file", str(path)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path))
    try:
        first = proc.stdout.readline()  # its addresses once it serves; "" when it exits first
        if first:
            proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return Outcome(bool(first), proc.returncode, err)


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", *args], capture_output=True, text=True,
                          timeout=60, env=_env(tmp_path))


def one_line(proc: subprocess.CompletedProcess, *parts: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    for part in parts:
        assert part in lines[0], lines[0]


# ---------------------------------------------------------------- serve --unix
def test_serve_refuses_to_replace_a_regular_file_at_its_unix_path(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("not a socket")
    serve(tmp_path, "--unix", str(precious)).refused(str(precious), "not a socket", "remove it")
    assert precious.read_text() == "not a socket"


def test_serve_refuses_a_unix_path_another_process_listens_on(tmp_path):
    path = tmp_path / "taken.sock"
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(path))
        live.listen(1)
        serve(tmp_path, "--unix", str(path)).refused(str(path), "listening on it")
        assert path.exists()


def test_serve_replaces_a_stale_socket(tmp_path):
    """A socket nobody listens on (left by a service that was killed) is the only thing replaced."""
    path = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(path))
    outcome = serve(tmp_path, "--unix", str(path))
    assert outcome.started, outcome.stderr[-2000:]


# ---------------------------------------------------------------- TLS
def _pem_pair(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "service.pem", tmp_path / "service.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=sparkflow-test", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    key.chmod(0o600)
    return cert, key


def test_a_tls_key_without_a_certificate_is_an_error_not_plaintext(tmp_path):
    _cert, key = _pem_pair(tmp_path)
    serve(tmp_path, "--conf", f"tls.keyFile={key}").refused("tls.keyFile", "tls.certFile", "plaintext")


def test_a_tls_certificate_without_its_key_is_an_error(tmp_path):
    cert, _key = _pem_pair(tmp_path)
    serve(tmp_path, "--conf", f"tls.certFile={cert}").refused(f"tls.certFile {cert}", "tls.keyFile")


@pytest.mark.parametrize("broken", ["missing", "directory", "not-pem", "key-is-a-certificate", "encrypted-key"])
def test_bad_tls_files_are_named(tmp_path, broken):
    cert, key = _pem_pair(tmp_path)
    if broken == "missing":
        cert = tmp_path / "no-such.pem"
        expected = (f"tls.certFile {cert}", "does not exist")
    elif broken == "directory":
        key = tmp_path
        expected = (f"tls.keyFile {key}", "is a directory")
    elif broken == "not-pem":
        cert.write_text("hello\n")
        expected = (f"tls.certFile {cert}", "no PEM certificate")
    elif broken == "key-is-a-certificate":
        key = cert
        expected = (f"tls.keyFile {key}", "private key")
    else:  # a pass phrase would be asked for on the terminal
        subprocess.run(["openssl", "rsa", "-in", str(key), "-aes256", "-passout", "pass:abcd", "-out", str(key)],
                       check=True, capture_output=True, timeout=60)
        expected = (f"tls.keyFile {key}", "encrypted")
    serve(tmp_path, "--conf", f"tls.certFile={cert}", "--conf", f"tls.keyFile={key}").refused(*expected)


def test_good_tls_files_start_the_service(tmp_path):
    cert, key = _pem_pair(tmp_path)
    outcome = serve(tmp_path, "--conf", f"tls.certFile={cert}", "--conf", f"tls.keyFile={key}")
    assert outcome.started, outcome.stderr[-2000:]
    both = tmp_path / "both.pem"  # a certificate file that holds its key too needs no tls.keyFile
    both.write_text(cert.read_text() + key.read_text())
    outcome = serve(tmp_path, "--conf", f"tls.certFile={both}")
    assert outcome.started, outcome.stderr[-2000:]


# ---------------------------------------------------------------- --insecure
@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_insecure_beyond_loopback_is_refused_saying_why(tmp_path, host):
    serve(tmp_path, "--insecure", "--host", host, secret=None).refused(
        "--insecure", host, "anyone who can reach", "--insecure-beyond-loopback")


def test_insecure_beyond_loopback_needs_its_own_flag(tmp_path):
    from sparkflow_exchange.network.advertised import interface_addresses

    found = interface_addresses(socket.AF_INET)
    if not found:
        pytest.skip("this host has no non-loopback IPv4 address")
    serve(tmp_path, "--insecure", "--host", found[0], secret=None).refused("--insecure-beyond-loopback")
    outcome = serve(tmp_path, "--insecure", "--insecure-beyond-loopback", "--host", found[0], secret=None)
    assert outcome.started, outcome.stderr[-2000:]
    assert "anyone who can reach" in outcome.stderr  # still said, as a warning


def test_insecure_on_loopback_starts(tmp_path):
    outcome = serve(tmp_path, "--insecure", "--host", "127.0.0.1", secret=None)
    assert outcome.started, outcome.stderr[-2000:]


# ---------------------------------------------------------------- secret and credentials files
@pytest.mark.parametrize("mode", [0o644, 0o604, 0o620, 0o666], ids=oct)
def test_a_secret_file_others_may_read_or_change_is_refused(tmp_path, mode):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef")
    secret.chmod(mode)
    serve(tmp_path, "--secret-file", str(secret)).refused(f"secretFile {secret}", f"mode {mode:o}",
                                                          f"chmod 600 {secret}")
    one_line(cli(tmp_path, "status", "--address", "127.0.0.1:1", "--secret-file", str(secret)),
             f"secretFile {secret}", f"mode {mode:o}", f"chmod 600 {secret}")


def test_a_group_readable_secret_file_is_accepted(tmp_path):
    """The documented way to share a client's secret with the applications' users (a group, mode 0640 or
    0440 as the Kubernetes executor template mounts it)."""
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef")
    secret.chmod(0o640)
    outcome = serve(tmp_path, "--secret-file", str(secret))
    assert outcome.started, outcome.stderr[-2000:]


@pytest.mark.parametrize("mode", [0o644, 0o640], ids=oct)
def test_a_credentials_file_others_may_read_is_refused(tmp_path, mode):
    creds = tmp_path / "credentials"
    creds.write_text("alice alice-secret-0123\n")
    creds.chmod(mode)
    serve(tmp_path, "--conf", f"credentialsFile={creds}").refused(
        f"credentialsFile {creds}", f"mode {mode:o}", f"chmod 600 {creds}")


def test_with_credentials_the_operator_secret_is_the_services_alone(tmp_path):
    """Application credentials make the secret file the operator's: a group that may read it holds the
    whole service."""
    creds, secret = tmp_path / "credentials", tmp_path / "secret"
    creds.write_text("alice alice-secret-0123\n")
    creds.chmod(0o600)
    secret.write_text("operator-secret-0123")
    secret.chmod(0o640)
    serve(tmp_path, "--secret-file", str(secret), "--conf", f"credentialsFile={creds}").refused(
        f"secretFile {secret}", "mode 640", "operator", f"chmod 600 {secret}")


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_secret_file_is_an_error_not_a_fresh_secret(tmp_path, content):
    secret = tmp_path / "secret"
    secret.write_text(content)
    secret.chmod(0o600)
    serve(tmp_path, "--secret-file", str(secret)).refused(f"secretFile {secret}", "is empty")
    one_line(cli(tmp_path, "list", "--address", "127.0.0.1:1", "--secret-file", str(secret)),
             f"secretFile {secret}", "is empty")


@pytest.mark.parametrize("kind", ["missing", "directory", "under-a-file", "unreadable"])
def test_a_secret_file_that_cannot_be_read_is_one_line(tmp_path, kind):
    if kind == "missing":
        path, cause = tmp_path / "no-such-secret", "does not exist"
    elif kind == "directory":
        path, cause = tmp_path, "is a directory"
    elif kind == "under-a-file":
        (tmp_path / "plain").write_text("x")
        path, cause = tmp_path / "plain" / "secret", "cannot be read"
    else:
        if ROOT_CAN_READ_ANYTHING:
            pytest.skip("root reads a file of mode 000")
        path, cause = tmp_path / "locked", "cannot be read"
        path.write_text("0123456789abcdef")
        path.chmod(0)
    serve(tmp_path, "--secret-file", str(path)).refused(f"secretFile {path}", cause)
    for command in ("status", "list"):
        one_line(cli(tmp_path, command, "--address", "127.0.0.1:1", "--secret-file", str(path)),
                 f"secretFile {path}", cause)
    one_line(cli(tmp_path, "drop", "some-exchange", "--address", "127.0.0.1:1", "--secret-file", str(path)),
             f"secretFile {path}", cause)


@pytest.mark.parametrize("broken", ["missing", "not-pem"])
def test_the_cli_names_a_bad_tls_ca_file(tmp_path, broken):
    ca = tmp_path / "ca.pem"
    if broken == "not-pem":
        ca.write_text("hello\n")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(f"spark.sparkflow.exchange.tls.caFile {ca}\n")
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef")
    secret.chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--address", "127.0.0.1:1",
                           "--secret-file", str(secret)], capture_output=True, text=True, timeout=60,
                          env={**_env(tmp_path), "SPARK_CONF_DIR": str(conf)})
    one_line(proc, f"tls.caFile {ca}", "does not exist" if broken == "missing" else "no PEM certificate")


def test_the_cli_under_an_unsafe_runtime_directory_says_so_in_one_line(tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o777)
    runtime.chmod(0o777)
    for command in ("status", "list"):
        one_line(cli(tmp_path, command), f"the runtime directory {runtime}", "chmod 700")


# ---------------------------------------------------------------- the JVM reads secretFile the same way
SECRET_CHECK_JAVA = r"""
public class SecretCheck {
    public static void main(String[] args) {
        for (String file : args) {
            try {
                System.out.println("ok " + org.sparkflow.exchange.discovery.Discovery.readSecretFile(file));
            } catch (IllegalArgumentException e) {
                System.out.println("refused " + e.getMessage());
            }
        }
    }
}
"""


def test_the_jvm_refuses_the_secret_files_python_refuses_with_the_same_message(tmp_path):
    if shutil.which("java") is None:
        pytest.skip("no java on PATH")
    import pyspark

    from sparkflow_exchange.config import ConfigError, read_secret_file

    jar = TESTS.parent / "sparkflow_exchange" / "jars" / "sparkflow-exchange-plugin.jar"
    if not jar.exists():
        pytest.skip("the plugin jar is not built (jvm-stub/build.py)")
    cases = []
    for name, content, mode in [("good", "s3cret\n", 0o600), ("group", "s3cret", 0o640), ("world", "s3cret", 0o644),
                                ("others-write", "s3cret", 0o602), ("group-write", "s3cret", 0o620),
                                ("empty", " \n", 0o600)]:
        path = tmp_path / name
        path.write_text(content)
        path.chmod(mode)
        cases.append(str(path))
    cases += [str(tmp_path / "missing"), str(tmp_path)]
    expected = []
    for case in cases:
        try:
            expected.append(f"ok {read_secret_file(case)}")
        except ConfigError as exc:
            expected.append(f"refused {exc}")
    source = tmp_path / "SecretCheck.java"
    source.write_text(SECRET_CHECK_JAVA)
    classpath = f"{jar}:{Path(pyspark.__file__).parent / 'jars'}/*"
    proc = subprocess.run(["java", "-cp", classpath, str(source), *cases], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == expected
    assert expected[:2] == ["ok s3cret", "ok s3cret"] and all(e.startswith("refused ") for e in expected[2:])


def test_serve_names_what_it_cannot_use_at_start(tmp_path):
    """A taken port, a spill directory under a file, a state file in a missing directory, settings in the
    environment that are not JSON: one line each, and the spill directory it made is gone again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "sparkflow_exchange.cli", "serve", "--port", str(port), "--spill-dir",
                str(tmp_path / "spill")]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env(tmp_path))
        one_line(proc, f"cannot listen on 127.0.0.1:{port}", "in use")
        assert not (tmp_path / "spill").exists()
    (tmp_path / "plain").write_text("x")
    serve(tmp_path / "a", "--spill-dir", str(tmp_path / "plain" / "spill")).refused(str(tmp_path / "plain" / "spill"))
    serve(tmp_path / "b", "--state-file", str(tmp_path / "missing" / "state.json")).refused(
        f"--state-file {tmp_path / 'missing' / 'state.json'}", "does not exist")
    proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "list"], capture_output=True, text=True,
                          timeout=60, env={**_env(tmp_path), "SPARKFLOW_EXCHANGE_CONF": "{not json"})
    one_line(proc, "SPARKFLOW_EXCHANGE_CONF is not JSON")


def test_the_plugins_launcher_names_a_secret_file_others_may_read(tmp_path):
    """What the Spark plugin runs on the driver: the JVM shows its one line, not a Python traceback."""
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef")
    secret.chmod(0o644)
    proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.service.plugin", "driver", "--jvm-pid",
                           str(os.getpid())], capture_output=True, text=True, timeout=60,
                          env={**_env(tmp_path), "SPARKFLOW_EXCHANGE_CONF": f'{{"secretFile": "{secret}"}}'})
    one_line(proc, "plugin (driver)", f"secretFile {secret}", "mode 644", f"chmod 600 {secret}")
