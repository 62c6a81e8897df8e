"""The operator's CLI (status, list, drop, --version) and Prometheus metrics against real services."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.consumer import input_gate as ex_gate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", *args], capture_output=True, text=True,
                          timeout=60)


def _write(config, rows: int) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    handle = ex.declare_write(config, schema, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([pa.record_batch([pa.array(range(rows), pa.int64())], schema=schema)])
    wh.commit_write(handle, [producer.finish()["partition"]])


def test_status_drop_and_metrics(tmp_service, tmp_path):
    port = _free_port()
    svc = tmp_service(conf={"metricsPort": port})
    config = client_config(svc, exchange="cli-orders", partitioner="hash", keys="id", numSubpartitions=2,
                           bufferSize="4k", hostId="another-host")  # another host: a remote (TCP) channel
    _write(config, 20_000)

    # a reader on subpartition 0 that stops after one batch keeps its channel open for status
    desc = ex.describe_exchange(config)
    it = ex.read_subpartition(config, desc, 0)
    first = next(it)
    assert first.num_rows > 0

    base = ["--address", svc.tcp, "--secret-file", str(svc.home / "secret")]
    status = _cli("status", "--json", *base)
    assert status.returncode == 0, status.stderr
    [data] = json.loads(status.stdout)
    assert [e["name"] for e in data["exchanges"]] == ["cli-orders"]
    assert data["partitions"][0]["bytes"] > 0 and "backpressure_ratio" in data["partitions"][0]
    chan = [c for c in data["channels"] if c["subpartition"] == 0]
    assert chan and chan[0]["bytes_sent"] > 0 and chan[0]["locality"] == "remote" and chan[0]["credit"] >= 0
    assert data["traffic"]["remote"] > 0
    assert data["exchange_traffic"]["cli-orders"]["bytes_read"] == sum(c["bytes_sent"] for c in data["channels"]) > 0

    human = _cli("status", *base)
    assert human.returncode == 0 and "cli-orders" in human.stdout and "backpressure" in human.stdout

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "# TYPE sparkflow_partition_bytes_total counter" in body
    assert 'sparkflow_channel_credit{service="' in body
    sid = data["service"]["service_id"]
    read = [line for line in body.splitlines()
            if line.startswith(f'sparkflow_exchange_read_bytes{{service="{sid}",exchange="cli-orders",path="channel"}}')]
    assert len(read) == 1 and int(read[0].split()[-1]) > 0, body[-3000:]

    rest = sum(b.num_rows for b in it)
    assert first.num_rows + rest > 0

    dropped = _cli("drop", "cli-orders", *base)
    assert dropped.returncode == 0 and "dropped cli-orders" in dropped.stdout
    again = _cli("drop", "cli-orders", *base)
    assert again.returncode == 1 and "exchange 'cli-orders' does not exist" in again.stderr
    assert svc.status()["partitions"] == []


def test_status_with_wrong_secret_is_refused(tmp_service, tmp_path):
    svc = tmp_service()
    bad = tmp_path / "bad-secret"
    bad.write_text("nope")
    bad.chmod(0o600)
    out = _cli("status", "--address", svc.tcp, "--secret-file", str(bad))
    assert out.returncode == 1
    assert "wrong secret" in out.stderr
    assert "--secret-file" in out.stderr and "spark.sparkflow" not in out.stderr
    none = _cli("status", "--address", svc.tcp)  # no secret at all: the hint names the CLI's flag
    assert none.returncode == 1 and "authentication required" in none.stderr, none.stderr
    assert "hint: the service needs its shared secret: give --secret-file FILE" in none.stderr
    assert "spark.sparkflow" not in none.stderr and "Traceback" not in none.stderr


def _private_runtime(monkeypatch, tmp_path) -> Path:
    """A runtime directory of the test's own: the services it starts register there, the CLI looks there."""
    runtime = tmp_path / "runtime"
    monkeypatch.setenv("SPARKFLOW_EXCHANGE_RUNTIME_DIR", str(runtime))
    return runtime


def test_version():
    from sparkflow_exchange import __version__

    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"sparkflow-exchange {__version__}"


def test_status_list_and_drop_find_a_service_started_by_serve(tmp_service, tmp_path, monkeypatch):
    _private_runtime(monkeypatch, tmp_path)
    svc = tmp_service()
    _write(client_config(svc, exchange="by-hand", partitioner="hash", keys="id", numSubpartitions=2), 5_000)
    status = _cli("status")  # no --address, no --secret-file: found in the runtime directory
    assert status.returncode == 0, status.stderr
    assert f"(serve) on 127.0.0.1  tcp {svc.tcp}" in status.stdout and "by-hand" in status.stdout
    listed = _cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    [exchange] = json.loads(listed.stdout)
    assert (exchange["name"], exchange["state"], exchange["rows"]) == ("by-hand", "committed", 5_000)
    table = _cli("list")
    assert table.returncode == 0 and "by-hand" in table.stdout and "5000" in table.stdout
    dropped = _cli("drop", "by-hand")
    assert dropped.returncode == 0 and "dropped by-hand (1 partitions released)" in dropped.stdout, dropped.stderr
    again = _cli("drop", "by-hand")
    assert again.returncode == 1 and "exchange 'by-hand' does not exist" in again.stderr
    assert svc.status()["partitions"] == []
    svc.stop()
    gone = _cli("status")
    assert gone.returncode == 1 and "no exchange service is running" in gone.stderr


def test_list_and_drop_with_no_service_running_start_none(tmp_path, monkeypatch):
    import sparkflow_exchange
    from sparkflow_exchange import ExchangeNotFound

    runtime = _private_runtime(monkeypatch, tmp_path)
    dropped = _cli("drop", "nothing-here")
    assert dropped.returncode == 1, dropped.stdout
    assert "exchange 'nothing-here' was not dropped: no exchange service is running" in dropped.stderr
    assert "none was started" in dropped.stderr and "--address" in dropped.stderr
    listed = _cli("list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [] and "no exchange service" in listed.stderr
    assert sparkflow_exchange.list_exchanges() == []
    with pytest.raises(ExchangeNotFound, match="none was started"):
        sparkflow_exchange.drop_exchange("nothing-here")
    assert not (runtime / "embedded.json").exists() and not list(runtime.glob("*.sock"))


def test_status_json_into_a_closed_pipe_ends_without_a_traceback(tmp_service, tmp_path, monkeypatch):
    _private_runtime(monkeypatch, tmp_path)
    tmp_service()
    proc = subprocess.Popen([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes a byte (`status --json | head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_status_shows_a_read_of_local_spill_files_as_it_goes(tmp_service, tmp_path, monkeypatch):
    """A reader on the service's host reads finished spill files itself; it tells the service as it goes,
    so the service's status (per partition and per exchange) shows the read's progress before it ends."""
    _private_runtime(monkeypatch, tmp_path)
    svc = tmp_service()
    config = client_config(svc, exchange="local-read", partitioner="hash", keys="id", numSubpartitions=1,
                           bufferSize="16k", hostId="127.0.0.1")  # the service's host: local spill files
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    handle = ex.declare_write(config, schema, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([pa.record_batch([pa.array(range(i * 2000, (i + 1) * 2000), pa.int64())], schema=schema)
                    for i in range(40)])
    wh.commit_write(handle, [producer.finish()["partition"]])

    def read_so_far() -> tuple[int, str]:
        out = _cli("status", "--json")
        assert out.returncode == 0, out.stderr
        [status] = json.loads(out.stdout)
        return status["exchange_traffic"]["local-read"]["file_bytes_read"], _cli("status").stdout

    before, text_before = read_so_far()
    assert before == 0
    desc = ex.describe_exchange(config)
    it = ex.read_subpartition(config, desc, 0)
    rows = next(it).num_rows
    time.sleep(ex_gate.FILE_REPORT_INTERVAL + 0.2)
    rows += next(it).num_rows  # the next buffer after the interval reports what was read so far
    deadline = time.monotonic() + 30
    during, text_during = read_so_far()
    while during == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
        during, text_during = read_so_far()
    assert during > 0, "the service did not hear of the read while it ran"
    assert text_during != text_before and "local files" in text_during
    rows += sum(b.num_rows for b in it)
    assert rows == 80_000
    deadline = time.monotonic() + 30
    after, _ = read_so_far()
    while after <= during and time.monotonic() < deadline:
        time.sleep(0.2)
        after, _ = read_so_far()
    assert after > during
    [part] = svc.status()["partitions"]
    assert part["file_bytes_read"] == after


def test_the_cli_finds_the_embedded_service_and_its_drop_lets_it_exit(tmp_path, monkeypatch):
    runtime = _private_runtime(monkeypatch, tmp_path)
    monkeypatch.setenv("SPARKFLOW_EXCHANGE_CONF", json.dumps({"embedded.idleTimeout": "1s"}))
    from harness import stop_embedded
    from test_embedded_lifetime import WRITER, _client, _exits_leaving_nothing

    try:
        pid = int(_client(WRITER, dict(os.environ), "via-cli"))
        status = _cli("status")
        assert status.returncode == 0 and "(embedded) on" in status.stdout and "via-cli" in status.stdout
        dropped = _cli("drop", "via-cli")
        assert dropped.returncode == 0, dropped.stderr
        _exits_leaving_nothing(pid, runtime)
    finally:
        stop_embedded(runtime)
