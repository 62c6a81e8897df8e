"""Bad input on the wire: each case gets an error that names the problem, and the service keeps serving."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
from harness import client_config

from sparkflow_exchange.network import auth
from sparkflow_exchange.network.blocking_client import ServiceError
from sparkflow_exchange.network.protocol import (
    MAGIC,
    PREFIX,
    VERSION,
    ErrorResponse,
    FrameDecoder,
    Hello,
    PartitionRequest,
    PushBuffer,
    RegisterPartition,
    ServerHello,
    encode_bytes,
)


class RawClient:
    """A raw socket speaking (or mangling) the protocol."""

    def __init__(self, svc, authenticate: bool = True, secret: str | None = None, unix: bool = False) -> None:
        if unix:  # the service's host: the Unix socket
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(svc.unix.removeprefix("unix:"))
        else:
            host, port = svc.tcp.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.decoder = FrameDecoder()
        self.pending: list = []
        hello = self.next()
        assert isinstance(hello, ServerHello)
        self.nonce = hello.nonce
        self.service_id = hello.service_id
        if authenticate:
            self.send(self.hello(secret or svc.secret))
            self.next()  # Welcome

    def hello(self, secret: str | None, client_id: str = "raw") -> Hello:
        """A Hello proving ``secret`` on this connection ("" without one)."""
        mine = auth.new_nonce()
        return Hello(client_id, auth.prove(secret, self.nonce, mine, self.service_id), "", mine)

    def send(self, msg) -> None:
        self.sock.sendall(encode_bytes(msg))

    def next(self, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while not self.pending:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def error_then_close(self, timeout: float = 10.0) -> ErrorResponse:
        msg = self.next(timeout)
        assert isinstance(msg, ErrorResponse), msg
        self.sock.settimeout(10)
        assert self.sock.recv(65536) == b"", "the service should close the connection after a fatal error"
        return msg


def healthy(svc) -> None:
    """A well-behaved client still gets answers."""
    with svc.connect() as conn:
        assert conn.call("ping")["service_id"]


@pytest.fixture
def svc(tmp_service):
    return tmp_service()


def frame(mtype: int, header: bytes = b"", payload: bytes = b"", magic: int = MAGIC, version: int = VERSION,
          length: int | None = None) -> bytes:
    body_len = PREFIX.size - 4 + len(header) + len(payload)
    return PREFIX.pack(body_len if length is None else length, magic, version, mtype, len(header)) + header + payload


@pytest.mark.parametrize("garbage, message", [
    (os.urandom(64), "protocol error"),
    (frame(30, magic=0xDEADBEEF), "bad magic 0xdeadbeef"),
    (frame(30, version=9), "unsupported protocol version 9"),
    (frame(30, length=1 << 30), "exceeds the maximum frame size"),
    (frame(99, b"{}"), "unknown message type 99"),
    (frame(10, b'{"partition": 3}'), "malformed PARTITION_REQUEST"),
])
def test_garbage_gets_a_named_fatal_error(svc, garbage, message):
    client = RawClient(svc)
    client.sock.sendall(garbage)
    error = client.error_then_close()
    assert error.fatal and message in error.message
    healthy(svc)


def test_unknown_partition_and_subpartition_out_of_range(svc):
    import pyarrow as pa

    from sparkflow_exchange import exchange as ex

    client = RawClient(svc)
    client.send(PartitionRequest("no-such-partition", 0, 7, 2))
    error = client.next()
    assert isinstance(error, ErrorResponse) and not error.fatal and error.receiver_id == 7
    assert "unknown partition 'no-such-partition'" in error.message

    cfg = client_config(svc, exchange="range", partitioner="hash", keys="a", numSubpartitions=2)
    schema = pa.schema([pa.field("a", pa.int64())])
    handle = ex.declare_write(cfg, schema, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([pa.record_batch([pa.array([1, 2, 3])], schema=schema)])
    pid = task.finish()["partition"]
    client.send(PartitionRequest(pid, 5, 8, 2))
    error = client.next()
    assert isinstance(error, ErrorResponse) and error.receiver_id == 8
    assert "subpartition index 5 is out of range" in error.message and "has 2 subpartitions" in error.message
    healthy(svc)


def test_a_resume_position_the_partition_does_not_hold_is_refused_at_once(svc):
    """A partition request that resumes (``resume_at``) gets the buffers from that position; one beyond what the
    subpartition holds, negative, or mixed with a range read is refused (InvalidRequest) without waiting, and a
    malformed one ends the connection naming the field."""
    import json

    import pyarrow as pa

    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange.errors import InvalidRequest, error_for
    from sparkflow_exchange.network.protocol import AddCredit, BufferResponse

    cfg = client_config(svc, exchange="resume", partitioner="hash", keys="a", numSubpartitions=1)
    schema = pa.schema([pa.field("a", pa.int64())])
    task = ex.ProducerTask(ex.declare_write(cfg, schema, overwrite=True), 0, "a0")
    task.write([pa.record_batch([pa.array([1, 2, 3])], schema=schema)])
    pid = task.finish()["partition"]
    client = RawClient(svc)
    client.send(PartitionRequest(pid, 0, 1, 4))  # from the start: its buffers and their sequence numbers
    whole = []
    while not whole or whole[-1].kind != 1:
        whole.append(client.next())
    assert all(isinstance(m, BufferResponse) for m in whole) and [m.seq for m in whole] == list(range(len(whole)))
    end = len(whole) - 1  # the end event's position: the last one a reader may resume at
    client.send(PartitionRequest(pid, 0, 2, 4, resume_at=end))
    resumed = client.next()
    assert (resumed.receiver_id, resumed.seq, bytes(resumed.payload)) == (2, end, bytes(whole[-1].payload))
    for rid, request, message in [
        (3, PartitionRequest(pid, 0, 3, 4, resume_at=end + 1),
         f"resume position {end + 1} is beyond subpartition 0 of partition {pid}"),
        (4, PartitionRequest(pid, 0, 4, 4, resume_at=1 << 40), f"resume position {1 << 40} is beyond"),
        (5, PartitionRequest(pid, 0, 5, 4, resume_at=-1), "resume position -1 is beyond"),
        (6, PartitionRequest(pid, 0, 6, 4, subpartition_end=1, resume_at=0), "resumes one subpartition"),
        (7, PartitionRequest(pid, 0, 7, 4, resume_from=1, resume_at=0), "no resume_from (1)"),
    ]:
        client.send(request)
        client.send(AddCredit(rid, 1))  # credit for a channel that was never opened changes nothing
        error = client.next(timeout=10)
        assert isinstance(error, ErrorResponse) and error.receiver_id == rid and not error.fatal, error
        assert message in error.message and error.code == "bad_request"
        assert isinstance(error_for(error.code, error.message), InvalidRequest)
    header = {"partition": pid, "subpartition": 0, "receiver_id": 9, "initial_credit": 4, "resume_at": "1"}
    client.sock.sendall(frame(10, json.dumps(header).encode()))
    error = client.error_then_close()
    assert error.fatal and "malformed PARTITION_REQUEST frame: field 'resume_at' is str" in error.message
    healthy(svc)


@pytest.mark.parametrize("secret, message", [(None, "authentication required"), ("wrong", "wrong secret")])
def test_missing_or_wrong_secret_is_refused(svc, secret, message):
    client = RawClient(svc, authenticate=False)
    client.send(client.hello(secret, "intruder"))
    error = client.error_then_close()
    assert error.fatal and message in error.message
    with pytest.raises(ServiceError, match=message):
        svc.connect(secret=secret)
    healthy(svc)


def test_request_before_hello_is_refused(svc):
    client = RawClient(svc, authenticate=False)
    client.send(PartitionRequest("x", 0, 1, 1))
    error = client.error_then_close()
    assert "expected Hello" in error.message
    healthy(svc)


def test_client_vanishing_mid_frame(svc):
    client = RawClient(svc)
    whole = encode_bytes(PushBuffer(1, 0, 0, 0, b"x" * 100_000))
    client.sock.sendall(whole[:50_000])
    client.sock.close()
    time.sleep(0.2)
    healthy(svc)
    assert svc.proc.poll() is None


def test_push_without_credit_or_registration(svc):
    client = RawClient(svc)
    client.send(PushBuffer(42, 0, 0, 0, b"data"))
    error = client.error_then_close()
    assert "unknown partition handle 42" in error.message

    client = RawClient(svc)
    client.send(RegisterPartition("p-credit", 1, "PIPELINED_BOUNDED", "", "", 1024, 1))
    registered = client.next()
    credit = client.next()
    assert credit.credit == 1
    client.send(PushBuffer(registered.handle, 0, 0, 0, b"a"))
    client.send(PushBuffer(registered.handle, 0, 0, 0, b"b"))  # the pool has one slot: no credit left
    error = client.error_then_close()
    assert "PushBuffer without credit" in error.message
    healthy(svc)


def test_register_bad_partition_type_is_named(svc):
    client = RawClient(svc)
    client.send(RegisterPartition("p-type", 1, "SOMETIMES"))
    error = client.next()
    assert isinstance(error, ErrorResponse) and "unknown partition type 'SOMETIMES'" in error.message
    healthy(svc)


def test_sigterm_exits_cleanly_and_removes_spill_files(tmp_service):
    import pyarrow as pa

    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange import write_handle as wh

    svc = tmp_service()
    cfg = client_config(svc, exchange="term", partitioner="hash", keys="a", numSubpartitions=2, partitionType="BLOCKING")
    schema = pa.schema([pa.field("a", pa.int64())])
    handle = ex.declare_write(cfg, schema, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([pa.record_batch([pa.array(range(1000))], schema=schema)])
    wh.commit_write(handle, [task.finish()["partition"]])
    assert list(svc.spill_dir.glob("*.data")) and list(svc.spill_dir.glob("*.index"))
    assert svc.stop(signal.SIGTERM) == 0
    assert not list(svc.spill_dir.glob("*.data")) and not list(svc.spill_dir.glob("*.index"))
    assert not os.path.exists(svc.unix.removeprefix("unix:"))


def test_tls(tmp_service, tmp_path):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl CLI not available")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    svc = tmp_service(conf={"tls.certFile": str(cert), "tls.keyFile": str(key)})
    assert svc.info["tls"] is True
    import pyarrow as pa

    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange import write_handle as wh

    cfg = client_config(svc, exchange="tls", partitioner="hash", keys="a", numSubpartitions=2, hostId="remote-host",
                        **{"tls.caFile": str(cert)})
    schema = pa.schema([pa.field("a", pa.int64())])
    handle = ex.declare_write(cfg, schema, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([pa.record_batch([pa.array(range(5000))], schema=schema)])
    wh.commit_write(handle, [task.finish()["partition"]])
    desc = ex.describe_exchange(cfg)
    rows = sorted(v for s in range(2) for b in ex.read_subpartition(cfg, desc, s) for v in b.column("a").to_pylist())
    assert rows == list(range(5000))
    # a plaintext client on the TLS port fails with an error that says what is wrong, not a hang
    import asyncio

    from sparkflow_exchange.network.aio_client import open_connection
    from sparkflow_exchange.network.blocking_client import BlockingConnection

    start = time.monotonic()
    with pytest.raises(ServiceError, match="no ServerHello within 2 s .*TLS"):
        BlockingConnection(svc.tcp, svc.secret, timeout=2.0)
    with pytest.raises(ServiceError, match="no ServerHello within 2 s .*TLS"):
        asyncio.run(open_connection(svc.tcp, svc.secret, timeout=2.0))
    assert time.monotonic() - start < 10
    healthy_tls = BlockingConnection(svc.tcp, svc.secret, timeout=10.0,
                                     ssl_ctx=auth.client_ssl_context(str(cert)))
    with healthy_tls as conn:  # and the service still serves TLS clients
        assert conn.call("ping")["service_id"]


def test_silent_or_half_frame_clients_do_not_block_others_and_are_dropped(svc):
    from sparkflow_exchange.config import ExchangeConfig

    hello_timeout = ExchangeConfig().hello_timeout
    silent = RawClient(svc, authenticate=False)  # connects, reads ServerHello, never says Hello
    half = RawClient(svc, authenticate=False)
    half.sock.sendall(encode_bytes(half.hello(svc.secret, "slow"))[:10])  # and stalls mid-frame
    healthy(svc)  # neither holds up the service
    start = time.monotonic()
    for client in (silent, half):
        error = client.error_then_close(timeout=hello_timeout + 5)
        assert error.fatal and "no Hello within" in error.message
    assert time.monotonic() - start < hello_timeout + 5
    healthy(svc)
