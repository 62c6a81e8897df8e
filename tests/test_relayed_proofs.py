"""A credential cannot borrow the operator's authority by relaying a handshake.

A service set up as docs/deployment.md ("Credentials and owners") says: its own secret (the operator) and two
application credentials, alice and bob. Bob runs a listener of his own that relays, frame by frame, whatever
dials it to the real service: the service's ServerHello to the dialer, the dialer's Hello back to the service.
If the coordinator dialed bob's listener with the operator secret, bob would hold an operator connection.
It must not: the coordinator dials only the registered services' addresses, a producer location naming
anything else is refused, readers are handed the registered addresses only, and a proof made for one service
is refused by the client before it is sent anywhere else.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config, start_service

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import schema_to_b64
from sparkflow_exchange.errors import AuthenticationFailed, ErrorCode, InvalidRequest
from sparkflow_exchange.network.aio_client import open_connection
from sparkflow_exchange.network.blocking_client import BlockingConnection, ServiceError
from sparkflow_exchange.network.protocol import (
    FrameDecoder,
    Hello,
    PartitionRegistered,
    RegisterPartition,
    RpcRequest,
    RpcResponse,
    ServerHello,
    encode_bytes,
)

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
SECRETS = {"alice": "alice-secret-0123456789", "bob": "bob-secret-0123456789"}


@pytest.fixture
def shared(tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text("".join(f"{n} {s}\n" for n, s in SECRETS.items()))
    creds.chmod(0o600)
    svc = start_service(tmp_path / "svc", conf={"credentialsFile": str(creds)})
    yield svc
    svc.stop()


def _read_frame(sock: socket.socket, decoder: FrameDecoder, timeout: float = 5.0):
    sock.settimeout(timeout)
    while True:
        data = sock.recv(65536)
        if not data:
            return None
        messages = decoder.feed(data)
        if messages:
            return messages[0]


class Relay:
    """Bob's listener: every connection to it is relayed to ``target`` through the handshake; the upstream
    half is kept, so bob can try what it may do."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.dialed = 0
        self.hellos = 0  # proofs the dialer sent through us
        self.stolen: list[tuple[socket.socket, FrameDecoder]] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                victim, _ = self.server.accept()
            except (socket.timeout, OSError):
                continue
            self.dialed += 1
            try:
                self._relay(victim)
            except OSError:
                pass
            finally:
                victim.close()

    def _relay(self, victim: socket.socket) -> None:
        host, port = self.target.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)), timeout=5)
        up, down = FrameDecoder(), FrameDecoder()
        greeting = _read_frame(upstream, up)
        assert isinstance(greeting, ServerHello)
        victim.sendall(encode_bytes(greeting))
        hello = _read_frame(victim, down)
        if not isinstance(hello, Hello):  # the dialer refused to prove anything to us
            upstream.close()
            return
        self.hellos += 1
        upstream.sendall(encode_bytes(hello))
        answer = _read_frame(upstream, up)
        if answer is not None:
            victim.sendall(encode_bytes(answer))
        self.stolen.append((upstream, up))

    def powers(self) -> list[str]:
        """What each relayed connection may do: "operator" when an operator-only call is served on it."""
        out = []
        for sock, decoder in self.stolen:
            try:
                sock.sendall(encode_bytes(RpcRequest(1, "release_partitions", {"partitions": []})))
                msg = _read_frame(sock, decoder)
                while msg is not None and not isinstance(msg, RpcResponse):
                    msg = _read_frame(sock, decoder)
                out.append("operator" if isinstance(msg, RpcResponse) and not msg.error else "nothing")
            except OSError:
                out.append("nothing")
        return out

    def close(self) -> None:
        self.closed.set()
        self.thread.join(5)
        self.server.close()
        for sock, _ in self.stolen:
            sock.close()


def _declare(conn: BlockingConnection, name: str) -> dict:
    return conn.call("declare", name=name, schema=schema_to_b64(SCHEMA), num_subpartitions=1,
                     partitioner={"name": "hash"}, partition_type="HYBRID", mode="overwrite")


def _register(conn: BlockingConnection, desc: dict, location: dict) -> None:
    conn.call("register_producer", name=desc["name"], epoch=desc["epoch"], write_id=desc["write_id"], index=0,
              attempt="0", partition=f"{desc['name']}.p0", location=location)


def test_a_relayed_proof_gains_bob_nothing(shared):
    relay = Relay(shared.tcp)
    bob = BlockingConnection(shared.tcp, SECRETS["bob"], timeout=10)
    try:
        real = bob.call("ping")
        desc = _declare(bob, "bobs")
        locations = {
            "an id of bob's choosing": {"service_id": "svc-bob", "host_id": "bobhost", "tcp": relay.address,
                                        "unix": "", "pid": 1},
            "the real id at bob's address": {**real, "tcp": relay.address},
            "the real id at bob's socket": {**real, "unix": "unix:/tmp/bobs.sock"},
        }
        refusals = {}
        for what, location in locations.items():
            with pytest.raises(InvalidRequest) as info:
                _register(bob, desc, location)
            refusals[what] = info.value
        assert all(e.code == ErrorCode.UNREGISTERED_SERVICE for e in refusals.values())
        assert "'svc-bob'" in str(refusals["an id of bob's choosing"]) \
            and "not a registered exchange service" in str(refusals["an id of bob's choosing"])
        assert relay.address in str(refusals["the real id at bob's address"])
        bob.call("drop", name="bobs")  # the coordinator releases what was registered: nothing at bob's
        time.sleep(1.0)  # a release is sent at once; give a wrong one time to dial
        assert relay.dialed == 0
        assert relay.powers() == []
        # the service is still the operator's alone
        with pytest.raises(ServiceError, match="needs the operator credential"):
            bob.call("attach_app", app="relayed", pid=1)
        assert shared.proc.poll() is None
    finally:
        bob.close()
        relay.close()


def test_a_location_is_stored_as_the_registry_has_it(shared):
    """A location that agrees with the registry joins; readers are handed the registered addresses only."""
    bob = BlockingConnection(shared.tcp, SECRETS["bob"], timeout=10)
    try:
        real = bob.call("ping")
        desc = _declare(bob, "bobs")
        # a partition of bob's own on the service (a producer joins only with a partition its service holds)
        bob.send(RegisterPartition(f"{desc['name']}.p0", 1, "HYBRID", exchange=desc["name"], attempt="0"))
        while not isinstance(bob.recv(10), PartitionRegistered):  # its credit may come first
            pass
        # what bob adds besides the address fields does not replace them
        _register(bob, desc, {"service_id": real["service_id"], "tcp": real["tcp"], "spill_dir": "/elsewhere"})
        [producer] = bob.call("get_exchange", name="bobs")["producers"]
        assert {k: producer["location"][k] for k in ("service_id", "host_id", "tcp", "unix", "pid")} == \
            {k: real[k] for k in ("service_id", "host_id", "tcp", "unix", "pid")}
    finally:
        bob.close()


def test_a_client_proves_nothing_to_a_service_other_than_the_one_it_expects(shared):
    """Were an operator client sent to bob's listener for a service it knows by id, the relayed greeting
    names another service: the client refuses before it proves anything, so bob's relay gets no proof."""
    relay = Relay(shared.tcp)
    try:
        with pytest.raises(AuthenticationFailed, match="'svc-bob' was expected there"):
            asyncio.run(open_connection(relay.address, shared.secret, timeout=5, expect_service="svc-bob"))
        deadline = time.monotonic() + 5
        while relay.dialed < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert relay.dialed == 1 and relay.hellos == 0 and relay.powers() == []
    finally:
        relay.close()


def test_owners_still_write_and_read_through_registered_services(shared):
    alice = client_config(shared, exchange="alices", partitioner="hash", keys="id", numSubpartitions=2,
                          partitionType="HYBRID", secret=SECRETS["alice"], hostId="elsewhere")
    handle = ex.declare_write(alice, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "t0")
    task.write([pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], schema=SCHEMA)])
    wh.commit_write(handle, [task.finish()["partition"]])
    desc = ex.describe_exchange(alice)
    assert sum(b.num_rows for sub in range(2) for b in ex.read_subpartition(alice, desc, sub)) == 100
