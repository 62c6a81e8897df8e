"""The jar's read task against a real service over TCP: all of a read partition's subpartitions of a producer at
once, and one connection to a service for every producer it holds (not one per producer and subpartition).

The producers' TCP addresses in the description are pointed at a counting proxy in front of the service, so the
test sees every connection the reader opens."""
from __future__ import annotations

import collections
import json
import shutil
import socket
import threading

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config
from jvm_units import compile_driver

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.calls import call

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
PRODUCERS = 4
ROWS = 20_000  # per producer


class CountingProxy:
    """A TCP proxy on 127.0.0.1 (ephemeral port) to ``target``, counting the connections it accepted."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            upstream = socket.create_connection(self.target, timeout=30)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def jvm(jar, tmp_path):
    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    return compile_driver(jar, tmp_path / "jvm")


def test_a_read_task_reads_its_subpartitions_of_every_producer_over_one_connection(tmp_service, jvm):
    svc = tmp_service()
    config = client_config(svc, exchange="conns", partitioner="hash", keys="id", numSubpartitions="4",
                           bufferSize="8k")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    parts = []
    for p in range(PRODUCERS):
        task = ex.ProducerTask(handle, p, f"a{p}")
        ids = np.arange(p * ROWS, (p + 1) * ROWS, dtype=np.int64)
        task.write([pa.record_batch([pa.array(ids)], schema=SCHEMA)])
        parts.append(task.finish()["partition"])
    wh.commit_write(handle, parts)
    desc = call(config, "get_exchange", name="conns")
    expected = collections.Counter(
        i for sub in (1, 3) for b in ex.read_subpartition(config, ex.describe_exchange(config), sub)
        for i in b.column("id").to_pylist())
    assert len(expected) > PRODUCERS * ROWS // 4  # both subpartitions hold rows of every producer

    proxy = CountingProxy(svc.tcp)
    try:
        for producer in desc["producers"]:  # every producer's service reached through the proxy only
            producer["location"]["tcp"] = proxy.address
            producer["location"]["unix"] = ""
        [answer] = jvm([{"op": "standalone_read", "describe": json.dumps(desc), "subpartitions": [1, 3],
                         "coordinator": svc.tcp, "secret": svc.secret, "host_id": "another-host", "columns": [0]}])
    finally:
        proxy.close()
    assert "error" not in answer, answer
    got = collections.Counter(np.frombuffer(bytes.fromhex(answer["hex"]), dtype="<i8").tolist())
    assert got == expected
    assert proxy.accepted == 1, f"{proxy.accepted} connections for {PRODUCERS} producers of one service"
