"""The operator's CLI (status, drop) and Prometheus metrics against a real service."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pyarrow as pa

from harness import client_config
from sparkflow_exchange import exchange as ex


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
    ex.commit_write(handle, [producer.finish()["partition"]])


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

    base = ["--address", svc.tcp, "--secret-file", str(svc.spill_dir.parent / "secret")]
    status = _cli("status", "--json", *base)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert [e["name"] for e in data["exchanges"]] == ["cli-orders"]
    assert data["partitions"][0]["bytes"] > 0 and "backpressure_ratio" in data["partitions"][0]
    chan = [c for c in data["channels"] if c["subpartition"] == 0]
    assert chan and chan[0]["bytes_sent"] > 0 and chan[0]["locality"] == "remote" and chan[0]["credit"] >= 0
    assert data["traffic"]["remote"] > 0

    human = _cli("status", *base)
    assert human.returncode == 0 and "cli-orders" in human.stdout and "backpressure" in human.stdout

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "# TYPE sparkflow_partition_bytes_total counter" in body
    assert 'sparkflow_channel_credit{service="' in body

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
    out = _cli("status", "--address", svc.tcp, "--secret-file", str(bad))
    assert out.returncode == 1
    assert "wrong secret" in out.stderr
