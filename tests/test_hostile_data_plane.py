"""The data plane answers to owners: a hostile holder of one valid credential (``app-b``) against another's
(``app-a``), with hand-framed protocol messages on real services.

Each case is an attack on what the data-plane messages (not RPCs) and the shared resources let one credential do to
another: failing another's producer with a partition of the same id on another service, registering partitions
with ids or labels too long for anyone to name again, holding subscriptions over many connections, subscribing and
never reading. Each must fail for the attacker with a clear refusal (or change nothing), and the owner's data must
read back exactly.
"""
from __future__ import annotations

import socket
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config, start_service

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.calls import call
from sparkflow_exchange.errors import ErrorCode, ExchangeError
from sparkflow_exchange.network.blocking_client import BlockingConnection, ServiceError
from sparkflow_exchange.network.protocol import ErrorResponse, PartitionRequest, RegisterPartition, RpcRequest
from sparkflow_exchange.network.rpc import MAX_ID_LENGTH
from sparkflow_exchange.service.rpc_handlers import MAX_SUBSCRIPTIONS
from sparkflow_exchange.writer.partition_writer import PartitionWriter

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
SECRETS = {"app-a": "secret-of-a-0123456789", "app-b": "secret-of-b-0123456789", "app-c": "secret-of-c-0123456789"}
REFUSED = (ExchangeError, ServiceError)


@pytest.fixture
def credentials(tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text("".join(f"{n} {s}\n" for n, s in SECRETS.items()))
    creds.chmod(0o600)
    return creds


@pytest.fixture
def shared(tmp_path, credentials):
    """The coordinator's service, shared by both credentials."""
    svc = start_service(tmp_path / "svc", conf={"credentialsFile": str(credentials)})
    yield svc
    svc.stop()


@pytest.fixture
def holder(tmp_path, credentials, shared):
    """Another host's service holding partitions for the coordinator (as the plugin's executor services do)."""
    svc = start_service(tmp_path / "holder", coordinator=False, host_id="hostB",
                        conf={"credentialsFile": str(credentials), "coordinator": shared.tcp})
    yield svc
    svc.stop()


def as_(svc, who: str, name: str = "orders", **kw):
    opts = dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=2, partitionType="HYBRID",
                secret=SECRETS[who], hostId="elsewhere", readerTimeout="30s")
    opts.update(kw)
    return client_config(svc, **opts)


def write(config, rows: int) -> list[str]:
    """One committed write of ``rows`` ids; its partitions."""
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "t0")
    task.write([pa.record_batch([pa.array(np.arange(rows, dtype=np.int64))], schema=SCHEMA)])
    partition = task.finish()["partition"]
    wh.commit_write(handle, [partition])
    return [partition]


def ids_of(config) -> list[int]:
    desc = ex.describe_exchange(config)
    out: list[int] = []
    for sub in range(2):
        for batch in ex.read_subpartition(config, desc, sub):
            out.extend(batch.column(0).to_pylist())
    return sorted(out)


def wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_failure_forged_with_anothers_partition_id_on_another_service_fails_nothing(shared, holder):
    """Her partitions live on the holder; he registers one of their ids, labelled with her exchange, on the
    coordinator's own service and fails it. Her producer stays finished and her read returns every row."""
    a = as_(shared, "app-a", service=holder.tcp)
    pid, = write(a, 1000)
    assert ex.describe_exchange(a).producers[0]["location"]["service_id"] == holder.info["service_id"]
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        forged = PartitionWriter(conn, pid, 2, "HYBRID", exchange="orders", attempt="t0")
        forged.fail("forged by bob")
        wait_for(lambda: "was not failed: the failure came from service" in (shared.home / "service.log").read_text(),
                 "the coordinator to note the forged failure")
    producer = ex.describe_exchange(a).producers[0]
    assert producer["state"] == "finished", producer
    assert ids_of(a) == list(range(1000))
    assert ids_of(as_(shared, "app-b")) == list(range(1000))  # reads stay open to every credential


def test_a_failure_reported_after_the_commit_changes_nothing(shared):
    """Even a failure the coordinator would take (the operator's, through the RPC) does not fail a committed
    producer: its rows are sealed, and a read never returns the exchange without them."""
    a = as_(shared, "app-a")
    pid, = write(a, 300)
    with shared.connect() as conn:  # the operator
        conn.call("producer_failed", name="orders", epoch=None, partition=pid, reason="too late")
    assert ex.describe_exchange(a).producers[0]["state"] == "finished"
    assert ids_of(a) == list(range(300))


@pytest.mark.parametrize("field", ["partition", "exchange", "attempt"])
def test_a_partition_named_longer_than_any_call_may_name_it_is_refused(shared, field):
    """An id or label no RPC could name again (its release, its status) is refused at registration; the service
    holds nothing of it and its status still answers."""
    long = "x" * (MAX_ID_LENGTH + 1)
    values = {"partition": "bobs-part", "exchange": "orders", "attempt": "t0", field: long}
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        conn.send(RegisterPartition(values["partition"], 2, "HYBRID", exchange=values["exchange"],
                                    attempt=values["attempt"]))
        reply = conn.recv(10)
        assert isinstance(reply, ErrorResponse), reply
        assert f"the {field} of a RegisterPartition is {MAX_ID_LENGTH + 1} characters long; at most {MAX_ID_LENGTH}" \
            in reply.message
        assert reply.code == ErrorCode.REGISTER_FAILED
        assert conn.call("ping")["service_id"]  # the connection goes on
    assert shared.status()["partitions"] == []


def test_a_failed_partition_with_no_exchange_label_is_released(shared):
    """A partition that names no exchange joins none: once it fails nobody could ever release it, so the
    service does, after the moment a join may still take."""
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        writer = PartitionWriter(conn, "unlabelled", 2, "HYBRID", exchange="", attempt="t0")
        assert [p["partition"] for p in shared.status()["partitions"]] == ["unlabelled"]
        writer.fail("gone")
        wait_for(lambda: shared.status()["partitions"] == [], "the unlabelled failed partition to be released")


def subscribe_many(conn: BlockingConnection, name: str, count: int, first: int = 0) -> None:
    """``count`` subscriptions to ``name`` on one connection, the requests pipelined, every reply checked."""
    for i in range(first, first + count):
        conn.send(RpcRequest(i + 1, "subscribe", {"name": name, "topic": f"t{i}"}))
    replies = 0
    while replies < count:
        msg = conn.recv(30)
        assert msg is not None, f"{replies} of {count} subscriptions answered"
        if getattr(msg, "call_id", None) is not None:
            assert msg.error is None, msg.error
            replies += 1


def test_one_credential_holds_at_most_its_share_of_subscriptions_over_all_its_connections(shared):
    a = as_(shared, "app-a")
    write(a, 10)
    with shared.connect(secret=SECRETS["app-b"]) as first, shared.connect(secret=SECRETS["app-b"]) as second:
        subscribe_many(first, "orders", MAX_SUBSCRIPTIONS)
        with pytest.raises(ServiceError, match=f"credential 'app-b' holds {MAX_SUBSCRIPTIONS} subscriptions over "
                                               "its connections") as info:
            second.call("subscribe", name="orders", topic="one-more")
        assert info.value.code == ErrorCode.LIMIT
        with shared.connect(secret=SECRETS["app-a"]) as hers:  # another credential's share is its own
            assert hers.call("subscribe", name="orders", topic="mine") == {"ok": True}
    wait_for(lambda: not any(c["credential"] == "app-b" for c in shared.status()["connections"]),
             "his connections to close")
    with shared.connect(secret=SECRETS["app-b"]) as again:  # closed connections give their subscriptions back
        assert again.call("subscribe", name="orders", topic="after") == {"ok": True}


def test_a_subscriber_that_never_reads_is_closed_and_the_owners_writes_go_on(shared):
    """He subscribes to her exchange many times on a connection whose receive buffer is small and never reads:
    each of her writes queues a notification per subscription; past a bound his connection is closed instead of
    holding the service's memory, and her writes and reads go on."""
    a = as_(shared, "app-a")
    write(a, 10)
    conn = BlockingConnection(shared.tcp, SECRETS["app-b"], timeout=10.0)
    try:
        subscribe_many(conn, "orders", MAX_SUBSCRIPTIONS)
        # from now on he reads nothing, into a small receive buffer (small from the start, the replies to his
        # pipelined subscriptions crawl through it, a delayed acknowledgement per segment)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        rss_before = shared.rss_bytes()
        closed = False
        for rows in range(20):
            write(a, 10 + rows)
            assert ids_of(a) == list(range(10 + rows))
            if not any(c.get("credential") == "app-b" for c in shared.status()["connections"]):
                closed = True
                break
        assert closed, "the subscriber that never reads was not closed"
        assert "left" in (shared.home / "service.log").read_text() and "bytes unread while subscribed" in \
            (shared.home / "service.log").read_text()
        # what was queued for him went with his connection (a bound far below what 20 writes' notifications
        # to 4,096 subscriptions would hold)
        assert shared.rss_bytes() - rss_before < 64 * 1024 * 1024
    finally:
        conn.sock.close()


# ---------------------------------------------------------------- readers

def forbidden(fn, *args, **kw) -> str:
    with pytest.raises(REFUSED) as info:
        fn(*args, **kw)
    assert info.value.code == ErrorCode.FORBIDDEN, info.value
    return str(info.value)


def request_refusal(svc, secret: str, partition: str) -> ErrorResponse:
    """A hand-framed request for subpartition 0 of ``partition``: the service's answer."""
    with svc.connect(secret=secret) as conn:
        conn.send(PartitionRequest(partition, 0, 7, 2))
        reply = conn.recv(10)
        assert isinstance(reply, ErrorResponse), reply
        return reply


@pytest.mark.parametrize("partition_type", ["HYBRID", "PIPELINED_BOUNDED"])
def test_an_exchange_with_readers_is_read_by_them_only_on_every_service_holding_it(shared, holder, partition_type):
    a = as_(shared, "app-a", service=holder.tcp, readers="app-c", partitionType=partition_type)
    pid, = write(a, 1000)
    b, c = as_(shared, "app-b", partitionType=partition_type), as_(shared, "app-c", partitionType=partition_type)
    message = forbidden(ex.describe_exchange, b)
    assert "reading 'orders' is refused: its owner, credential 'app-a', lets 'app-c' read it" in message
    assert "authenticated as 'app-b'" in message
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        with pytest.raises(ServiceError, match="reading 'orders' is refused") as info:
            conn.call("subscribe", name="orders", topic="peek")
        assert info.value.code == ErrorCode.FORBIDDEN
    listed = {e["name"]: e for e in ex.list_exchanges(b)}
    assert listed["orders"]["readers"] == ["app-c"] and listed["orders"]["owner"] == "app-a"
    # the partition's id is no key: the service holding it refuses him (a bounded partition: nothing consumed)
    reply = request_refusal(holder, SECRETS["app-b"], pid)
    assert reply.code == ErrorCode.FORBIDDEN
    assert f"reading partition {pid!r} of exchange 'orders' is refused: its writer, credential 'app-a'" in reply.message
    if partition_type == "HYBRID":
        assert ids_of(c) == list(range(1000))  # a named reader
        assert ids_of(a) == list(range(1000))  # the owner
    else:  # read once: by the named reader, every row
        assert ids_of(c) == list(range(1000))


def test_readers_may_not_be_changed_by_an_append_and_are_kept_by_it(shared):
    a = as_(shared, "app-a", readers="app-c")
    write(a, 10)
    handle = ex.declare_write(as_(shared, "app-a"), SCHEMA, overwrite=False)  # an append naming none keeps them
    assert ex.describe_exchange(a).readers == ("app-c",)
    wh.commit_write(handle, [])
    with pytest.raises(REFUSED, match="the exchange keeps readers=app-c, those it was created with"):
        ex.declare_write(as_(shared, "app-a", readers="app-b"), SCHEMA, overwrite=False)
    with pytest.raises(REFUSED, match="is not a credential name"):
        ex.declare_write(as_(shared, "app-a", readers="app b"), SCHEMA, overwrite=True)


def test_a_service_can_make_new_exchanges_private(tmp_path, credentials):
    svc = start_service(tmp_path / "private", conf={"credentialsFile": str(credentials), "defaultReaders": ""})
    try:
        a, b = as_(svc, "app-a"), as_(svc, "app-b")
        pid, = write(a, 100)
        assert ex.describe_exchange(a).readers == ()
        assert "lets no other credential read it" in forbidden(ex.describe_exchange, b)
        assert request_refusal(svc, SECRETS["app-b"], pid).code == ErrorCode.FORBIDDEN
        write(as_(svc, "app-a", name="open", readers="*"), 5)  # a writer opens its own
        assert ids_of(as_(svc, "app-b", name="open")) == list(range(5))
        assert ids_of(a) == list(range(100))
    finally:
        svc.stop()


def test_a_stream_with_readers_refuses_others_its_description_plan_and_groups(shared):
    a = as_(shared, "app-a", name="events", readers="app-c")
    from sparkflow_exchange.spark import streaming

    handle = streaming.declare_stream(a, SCHEMA)
    wh_epoch = streaming.begin_epoch(handle, 0, "q")
    assert wh_epoch.private_readers == ("app-c",)
    b = as_(shared, "app-b", name="events")
    assert "reading 'events' is refused" in forbidden(call, b, "stream_describe", name="events")
    assert "joining a consumer group of 'events' is refused" in forbidden(call, b, "stream_join", name="events")
    assert "refused" in forbidden(call, b, "stream_plan", name="events", after=-1, upto=0)
    c = as_(shared, "app-c", name="events")
    assert call(c, "stream_describe", name="events")["readers"] == ["app-c"]
    assert call(c, "stream_join", name="events")["group"]


def test_reported_file_reads_count_only_readers_and_at_most_the_partitions_size(shared):
    """Readers on the holder's host report what they read from its files themselves: a report is counted only from
    a credential that may read the partition, and at most once the partition's size per report."""
    a = as_(shared, "app-a", readers="app-c")
    pid, = write(a, 1000)

    def reported() -> tuple[int, int]:
        part = next(p for p in shared.status()["partitions"] if p["partition"] == pid)
        return part["file_bytes_read"], part["bytes"]

    huge = {pid: 10**15, "no-such-partition": 10**15}
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        conn.call("report_file_reads", bytes=10**15, partitions=huge)
    assert reported()[0] == 0, "a credential that may not read the partition set its metrics"
    with shared.connect(secret=SECRETS["app-c"]) as conn:
        conn.call("report_file_reads", bytes=10**15, partitions=huge)
    counted, size = reported()
    assert size > 0 and counted == size, (counted, size)
