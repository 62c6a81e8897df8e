"""Files and names: what a service writes is private and goes when it is no longer needed; names a
client chose cannot make file names too long nor add lines to metrics, status or logs."""
from __future__ import annotations

import json
import socket
import stat
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
from sparkflow_exchange.errors import ExchangeError
from sparkflow_exchange.network.blocking_client import ServiceError

SCHEMA = pa.schema([pa.field("id", pa.int64())])


def _batch(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n))], schema=SCHEMA)


def _write(config, rows: int) -> str:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([_batch(rows)])
    partition = task.finish()["partition"]
    wh.commit_write(handle, [partition])
    return partition


def _modes(directory: Path) -> dict[str, int]:
    """The files a service keeps in its spill directory (besides the lock it holds while it lives)."""
    return {p.name: stat.S_IMODE(p.lstat().st_mode) for p in directory.iterdir() if p.name != ".lock"}


def _rows(config) -> int:
    desc = ex.describe_exchange(config)
    return sum(b.num_rows for sub in range(desc.num_subpartitions) for b in ex.read_subpartition(config, desc, sub))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("partition_type", ["HYBRID", "BLOCKING"])
def test_files_are_private_and_go_with_dropped_or_replaced_writes(tmp_service, partition_type):
    svc = tmp_service()  # its spillDir does not exist yet: the service makes it
    assert stat.S_IMODE(svc.spill_dir.stat().st_mode) == 0o700
    config = client_config(svc, exchange="kept", partitioner="hash", keys="id", numSubpartitions="2",
                           partitionType=partition_type)
    kept = _write(config, 1000)

    # a write still running when its exchange is dropped, another when its exchange is overwritten
    for name, replace in (("dropped", lambda cfg: ex.drop_exchange("dropped", cfg)),
                          ("replaced", lambda cfg: _write(cfg, 10))):
        cfg = config.replace(exchange=name)
        handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
        task = ex.ProducerTask(handle, 0, "late")
        task.write([_batch(5000)])
        replace(cfg)
        with pytest.raises((ServiceError, ExchangeError)):
            task.finish()
        task.fail("the test")

    files = _modes(svc.spill_dir)
    assert files and set(files.values()) == {0o600}, files
    # what is left: the kept write's data and index, and the replacing write's
    assert len(files) == 4 and sum(kept.split(".")[0] in f for f in files) == 2, sorted(files)
    ex.drop_exchange("kept", config)
    ex.drop_exchange("replaced", config)
    assert _modes(svc.spill_dir) == {}
    assert svc.stop() == 0
    assert not svc.spill_dir.exists()  # it made the directory: it removes it


def test_a_service_started_without_a_secret_leaves_nothing_in_its_spill_dir(tmp_path):
    spill = tmp_path / "made" / "spill"
    proc = subprocess.Popen([sys.executable, "-m", "sparkflow_exchange.service", "--host", "127.0.0.1", "--port", "0",
                             "--spill-dir", str(spill)], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        own = Path(info["spill_dir"])  # the service's own directory in the spill root it was given
        assert own.parent == spill and info["secret_file"] == str(own / "secret")
        for made in (own, spill, spill.parent):
            assert stat.S_IMODE(made.stat().st_mode) == 0o700
        assert set(_modes(own).values()) == {0o600}  # the secret, the Unix socket
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert not spill.parent.exists()


def test_a_long_name_makes_a_short_file_name(tmp_service):
    svc = tmp_service()
    name = "交换" * 40  # 80 CJK characters: 240 bytes of UTF-8
    config = client_config(svc, exchange=name, partitioner="hash", keys="id", numSubpartitions="2")
    _write(config, 3000)
    assert _rows(config) == 3000
    names = list(_modes(svc.spill_dir))
    assert names and max(len(n.encode()) for n in names) < 100, names


def test_names_cannot_add_lines_to_metrics_status_or_logs(tmp_service):
    port = _free_port()
    svc = tmp_service(conf={"metricsPort": port})
    name = 'evil"\nsparkflow_injected{service="x"} 1\n# TYPE'
    _write(client_config(svc, exchange=name, partitioner="hash", keys="id", numSubpartitions="2"), 100)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert not [line for line in body.splitlines() if line.startswith("sparkflow_injected")]
    assert 'exchange="evil\\"\\nsparkflow_injected{service=\\"x\\"} 1\\n# TYPE"' in body
    for line in body.splitlines():  # every line a comment or one sample
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or line.startswith("sparkflow_"), line

    out = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--address", svc.tcp,
                          "--secret-file", str(svc.home / "secret")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "evil\"\\nsparkflow_injected" in out.stdout
    assert not [line for line in out.stdout.splitlines() if line.startswith("sparkflow_injected")]



def test_a_name_in_a_log_message_stays_on_its_line():
    """The service's log handler escapes control characters of every message (and rate-limits them)."""
    import io
    import logging

    from sparkflow_exchange.service.log_limit import install

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    install(handler)
    logger = logging.getLogger("sparkflow_exchange.test_names")
    logger.addHandler(handler)
    try:
        logger.warning("reading partition %s failed", "p\nsparkflow_injected 1\r")
    finally:
        logger.removeHandler(handler)
    assert out.getvalue() == "reading partition p\\nsparkflow_injected 1\\r failed\n"


def test_metrics_listen_on_loopback_unless_told_otherwise(tmp_service):
    for conf, reachable in (({}, "127.0.0.1"), ({"metricsHost": "127.0.0.2"}, "127.0.0.2")):
        port = _free_port()
        svc = tmp_service(host="127.0.0.2", conf={"metricsPort": port, **conf})  # the service on 127.0.0.2
        body = urllib.request.urlopen(f"http://{reachable}:{port}/metrics", timeout=10).read().decode()
        assert "sparkflow_memory_budget_bytes" in body
        other = "127.0.0.2" if reachable == "127.0.0.1" else "127.0.0.1"
        with pytest.raises(OSError):
            socket.create_connection((other, port), timeout=10).close()
        svc.stop()


def test_a_writer_lost_before_it_joined_its_exchange_leaves_nothing(tmp_service):
    """Killed between registering its partition and register_producer: the coordinator never heard of the
    partition, so no drop would release it; the service does, with its spill file."""
    from sparkflow_exchange.network.protocol import PartitionRegistered, RegisterPartition

    svc = tmp_service()
    config = client_config(svc, exchange="joined-never", partitioner="hash", keys="id", numSubpartitions="2")
    ex.declare_write(config, SCHEMA, overwrite=True)
    writer = svc.connect()
    writer.send(RegisterPartition("joined-never.1.0.a0.x", 2, "HYBRID", exchange="joined-never"))
    while not isinstance(writer.recv(30), PartitionRegistered):
        pass
    assert [p["partition"] for p in svc.status()["partitions"]] == ["joined-never.1.0.a0.x"]
    assert list(svc.spill_dir.glob("*.data"))
    writer.sock.close()  # as a kill -9 would
    deadline = time.monotonic() + 30
    while svc.status()["partitions"]:
        assert time.monotonic() < deadline, svc.status()["partitions"]
        time.sleep(0.1)
    assert _modes(svc.spill_dir) == {}
