"""A plain connection's writes go straight to its socket, spilled buffers from their file (sendfile); TLS through
the transport. Every byte in order, every frame whole or the connection closed, every descriptor given back."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.errors import ExchangeReadError
from sparkflow_exchange.network.socket_writer import SocketWriter
from sparkflow_exchange.partition.spill import FileSpan, SpillCorruptError
from sparkflow_exchange.partition.subpartition import SPAN_MIN

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
ROWS = 200_000  # about 3.6 MB: a few 1 MiB buffers


def _pair(kind: str) -> tuple[socket.socket, socket.socket]:
    """Two connected non-blocking stream sockets with small kernel buffers, so writes queue."""
    if kind == "unix":
        a, b = socket.socketpair()
    else:
        server = socket.create_server(("127.0.0.1", 0))
        b = socket.create_connection(server.getsockname())
        a, _ = server.accept()
        server.close()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
        s.setblocking(False)
    return a, b


async def _read_all(loop, sock: socket.socket, deadline: float = 20.0) -> bytes:
    got = bytearray()
    end = time.monotonic() + deadline
    while True:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), max(0.1, end - time.monotonic()))
        if not data:
            return bytes(got)
        got += data


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_frames_of_memory_and_file_spans_arrive_whole_and_in_order(tmp_path, kind):
    data_file = tmp_path / "part.data"
    content = np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    data_file.write_bytes(content)
    fd = os.open(data_file, os.O_RDONLY)
    spans: list[FileSpan] = []

    async def scenario() -> tuple[bytes, bytes, list, list]:
        loop = asyncio.get_running_loop()
        a, b = _pair(kind)
        events: list[str] = []
        errors: list[BaseException] = []
        writer = SocketWriter(loop, a.fileno(), 256 << 10, 64 << 10, lambda: events.append("pause"),
                              lambda: events.append("resume"), errors.append)
        expected = bytearray()
        payload = bytearray(content[:300_000])
        for i, (offset, length) in enumerate([(0, 1 << 20), (5, 700_001), (2 << 20, 1 << 20)]):
            header = bytes([i]) * 20
            body = memoryview(payload)[i * 1000:i * 1000 + 90_000]
            span = FileSpan(os.dup(fd), offset, length, data_file)
            spans.append(span)
            writer.write([header, body])  # a frame from memory: sent without a copy
            writer.write([header, span])  # one from the file
            expected += header + bytes(body) + header + content[offset:offset + length]
        assert writer.queue and events == ["pause"]  # the socket did not take it all: the rest waits, in order
        got = await asyncio.wait_for(_read_after_drain(loop, writer, a, b), 30)
        return got, bytes(expected), events, errors

    got, expected, events, errors = asyncio.run(scenario())
    os.close(fd)
    assert not errors
    assert got == expected
    assert events == ["pause", "resume"]
    assert all(span.fd == -1 for span in spans)  # each span's descriptor was given back once sent


async def _read_after_drain(loop, writer: SocketWriter, a: socket.socket, b: socket.socket) -> bytes:
    """Read everything ``writer`` sends; once it drained, close the connection (the writer's close first)."""
    reader = asyncio.ensure_future(_read_all(loop, b))
    closed = loop.create_future()
    writer.close_when_drained(lambda: closed.set_result(None))
    await closed
    writer.abort()
    a.close()
    got = await reader
    b.close()
    return got


def test_a_span_whose_file_shrinks_on_the_way_closes_the_connection_naming_the_file(tmp_path):
    data_file = tmp_path / "part.data"
    data_file.write_bytes(bytes(range(256)) * (16 << 10))  # 4 MiB
    fd = os.open(data_file, os.O_RDONLY)

    async def scenario():
        loop = asyncio.get_running_loop()
        a, b = _pair("tcp")
        errors: list[BaseException] = []

        def failed(exc: BaseException) -> None:
            errors.append(exc)
            a.close()  # what the connection does: it ends

        writer = SocketWriter(loop, a.fileno(), 8 << 20, 1 << 20, lambda: None, lambda: None, failed)
        span = FileSpan(os.dup(fd), 0, 4 << 20, data_file)
        writer.write([b"H" * 24, span])
        assert writer.queue  # 4 MiB do not fit the socket: the span waits, part of it sent
        os.truncate(data_file, 1 << 20)  # the file loses its tail while the frame is on its way
        got = await _read_all(loop, b)
        b.close()
        return got, errors, writer, span

    got, errors, writer, span = asyncio.run(scenario())
    os.close(fd)
    assert len(got) < 24 + (4 << 20)  # never a whole frame: the reader sees the connection end mid-frame
    assert len(errors) == 1 and isinstance(errors[0], SpillCorruptError)
    assert str(data_file) in str(errors[0]) and "truncated" in str(errors[0])
    assert writer.broken and not writer.queue and span.fd == -1
    writer.write([b"late", FileSpan(os.dup(os.open(data_file, os.O_RDONLY)), 0, 10, data_file)])  # dropped, closed
    assert not writer.queue


# ---------------------------------------------------------------- through a real service
def _write(config, rows: int = ROWS) -> str:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    ids = np.arange(rows, dtype=np.int64)
    producer.write([pa.record_batch([pa.array(ids), pa.compute.cast(pa.array(ids), pa.string())], schema=SCHEMA)])
    result = producer.finish()
    wh.commit_write(handle, [result["partition"]], {result["partition"]: result["rows"]})
    return result["partition"]


def _read_ids(config) -> list[int]:
    desc = ex.describe_exchange(config)
    return [i for b in ex.read_subpartition(config, desc, 0) for i in b.column("id").to_pylist()]


def _remote(svc, name: str, **kw):
    """A reader on another host (TCP) of a spilled partition with 1 MiB buffers (sent as file spans)."""
    return client_config(svc, exchange=name, partitioner="forward", numSubpartitions=1, partitionType="BLOCKING",
                         bufferSize="1m", hostId="elsewhere", readerTimeout="60s", **kw)


def _connections(svc) -> list[dict]:
    with svc.connect(svc.unix) as conn:  # its Unix socket: plain even where TCP takes TLS only
        return conn.call("status")["connections"]


def _file_bytes_sent(svc) -> int:
    return sum(c["file_bytes_sent"] for c in _connections(svc))


def test_a_remote_read_of_a_spilled_partition_is_sent_from_its_file(tmp_service):
    svc = tmp_service()
    config = _remote(svc, "spans")
    _write(config)
    held = next(p["bytes"] for p in svc.status()["partitions"])
    assert held > 3 * SPAN_MIN
    assert sorted(_read_ids(config)) == list(range(ROWS))
    assert sorted(_read_ids(config)) == list(range(ROWS))  # read again on the same connection
    sent = _file_bytes_sent(svc)  # the reader's connection stays open in this process
    assert held <= sent <= 2 * held


def test_a_spill_file_truncated_before_the_read_fails_it_naming_the_file(tmp_service):
    svc = tmp_service()
    config = _remote(svc, "spans-truncated")
    pid = _write(config)
    (data,) = [Path(p["spill_path"]) for p in svc.status()["partitions"] if p["spill_path"]]
    os.truncate(data, data.stat().st_size // 2)
    start = time.monotonic()
    with pytest.raises(ExchangeReadError, match="truncated") as err:
        _read_ids(config)
    assert time.monotonic() - start < 10
    assert pid in str(err.value) and str(data) in str(err.value)
    other = _remote(svc, "spans-healthy")  # the service goes on serving
    _write(other, 50_000)
    assert sorted(_read_ids(other)) == list(range(50_000))


def test_over_tls_the_transport_sends_and_nothing_comes_from_files(tmp_service, tmp_path):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl CLI not available")
    cert, key = tmp_path / "svc.pem", tmp_path / "svc.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    svc = tmp_service(conf={"tls.certFile": str(cert), "tls.keyFile": str(key)})
    config = _remote(svc, "spans-tls", **{"tls.caFile": str(cert)})
    _write(config)
    assert sorted(_read_ids(config)) == list(range(ROWS))
    tcp = [c for c in _connections(svc) if c["transport"] == "tcp"]
    assert max(c["bytes_sent"] for c in tcp) > 3 * SPAN_MIN  # the read came over TLS...
    assert all(c["file_bytes_sent"] == 0 for c in tcp)  # ...every byte written by the transport
