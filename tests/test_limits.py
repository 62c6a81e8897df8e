"""Fair limits: one application credential at its caps leaves another able to connect, list, write and read.

A real service with an operator secret and two application credentials, with small caps so each test is
quick: connections (maxConnectionsPerCredential), exchanges (maxExchangesPerCredential), name lengths
(MAX_NAME_LENGTH), a partition's width (its bookkeeping counted before it is made), memory
(credentialMemoryShare of memory.budget) and disk (credentialDiskShare of maxDiskBytes). Every refusal
names the limit and the credential; the operator has none of these caps.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config, start_service

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import schema_to_b64
from sparkflow_exchange.calls import call
from sparkflow_exchange.errors import ErrorCode, ExchangeError
from sparkflow_exchange.network.blocking_client import ServiceError
from sparkflow_exchange.network.rpc import MAX_NAME_LENGTH
from sparkflow_exchange.spark import streaming as st
from sparkflow_exchange.writer.partition_writer import PartitionWriter

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
SECRETS = {"app-a": "secret-of-a-0123456789", "app-b": "secret-of-b-0123456789"}
REFUSED = (ExchangeError, ServiceError)
CAPS = {"maxConnectionsPerCredential": 6, "maxExchangesPerCredential": 3, "maxGroupsPerCredential": 4,
        "memory.budget": "8m",
        "credentialMemoryShare": 0.5, "maxDiskBytes": "2m", "credentialDiskShare": 0.5}


@pytest.fixture
def capped(tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text("".join(f"{n} {s}\n" for n, s in SECRETS.items()))
    creds.chmod(0o600)
    svc = start_service(tmp_path / "svc", conf={"credentialsFile": str(creds), **CAPS})
    yield svc
    svc.stop()


def as_(svc, who: str, name: str = "orders", **kw):
    secret = svc.secret if who == "operator" else SECRETS[who]
    opts = dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=2, partitionType="HYBRID",
                secret=secret, hostId="elsewhere", readerTimeout="20s", bufferSize="32k",
                compression="none")  # the shares below are counted in raw bytes
    opts.update(kw)
    return client_config(svc, **opts)


def write(config, rows: int) -> None:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "t0")
    try:
        task.write([pa.record_batch([pa.array(np.arange(rows, dtype=np.int64))], schema=SCHEMA)])
        wh.commit_write(handle, [task.finish()["partition"]])
    except BaseException as exc:
        task.fail(str(exc))
        wh.abort_write(handle, str(exc))
        raise


def rows_of(config) -> int:
    desc = ex.describe_exchange(config)
    return sum(b.num_rows for sub in range(2) for b in ex.read_subpartition(config, desc, sub))


def alice_is_served(svc, name: str = "alices") -> None:
    """The other credential connects, lists, writes and reads."""
    a = as_(svc, "app-a", name=name)
    ex.list_exchanges(a)
    write(a, 5000)
    assert rows_of(a) == 5000
    ex.drop_exchange(name, a)


def limited(fn, *args, **kw) -> str:
    with pytest.raises(REFUSED) as info:
        fn(*args, **kw)
    assert info.value.code == ErrorCode.LIMIT, info.value
    return str(info.value)


def test_a_credential_at_its_connection_cap_leaves_room_for_the_others(capped):
    held = [capped.connect(secret=SECRETS["app-b"]) for _ in range(CAPS["maxConnectionsPerCredential"])]
    try:
        message = limited(capped.connect, secret=SECRETS["app-b"])
        assert "credential 'app-b'" in message and "maxConnectionsPerCredential=6" in message
        alice_is_served(capped)
        assert capped.status()["credentials"]["app-b"]["connections"] == 6  # the operator is not capped
        held.pop().close()
        held.append(capped.connect(secret=SECRETS["app-b"]))  # a connection closed makes room again
        assert held[-1].call("ping")["service_id"]
    finally:
        for conn in held:
            conn.close()


def test_a_credential_owns_at_most_its_exchanges_and_streams(capped):
    b = [as_(capped, "app-b", name=f"b{i}") for i in range(3)]
    write(b[0], 10)
    write(b[1], 10)
    st.declare_stream(as_(capped, "app-b", name="b-stream"), SCHEMA)  # a stream counts too
    message = limited(ex.declare_write, b[2], SCHEMA, overwrite=True)
    assert "credential 'app-b' owns 3" in message and "maxExchangesPerCredential=3" in message
    write(b[0], 20)  # overwriting its own adds none
    alice_is_served(capped)
    ex.drop_exchange("b-stream", b[0])
    write(b[2], 10)  # a drop makes room


def test_a_credential_owns_at_most_its_consumer_groups_and_the_stream_owner_still_reads(capped):
    """Every group holds epochs back and is listed to everyone: a stranger cannot join without end."""
    a = as_(capped, "app-a", name="events")
    st.declare_stream(a, SCHEMA)
    b = as_(capped, "app-b", name="events")
    groups = [st.join_group(b, f"b-{i}")["group"] for i in range(4)]
    message = limited(st.join_group, b, "b-4")
    assert "credential 'app-b' owns 4 consumer groups" in message and "maxGroupsPerCredential=4" in message
    limited(st.join_group, b)  # a group of its own named by the service counts too
    assert st.join_group(a, "a-readers")["group"] == "a-readers"  # the others are not affected
    st.leave_group(b, groups[0])
    assert st.join_group(b, "b-4")["group"] == "b-4"  # leaving one makes room
    alice_is_served(capped)


def test_names_are_at_most_their_documented_length_and_listings_stay_small(capped):
    b = as_(capped, "app-b")
    long_name = "n" * (35 << 20)  # 35 MiB: two such names broke listings for everyone
    for _ in range(2):
        with pytest.raises(REFUSED, match=f"argument 'name' is {35 << 20} characters long; the name of an "
                                          f"exchange, stream or consumer group \\(MAX_NAME_LENGTH\\) may be at "
                                          f"most {MAX_NAME_LENGTH} characters"):
            call(b, "declare", name=long_name, schema=schema_to_b64(SCHEMA), num_subpartitions=2,
                 partitioner={"name": "hash", "keys": ["id"]}, partition_type="HYBRID", mode="overwrite")
    write(as_(capped, "app-b", name="x" * MAX_NAME_LENGTH), 10)  # the longest name allowed
    with pytest.raises(REFUSED, match="MAX_NAME_LENGTH"):
        st.join_group(as_(capped, "app-b", name="x" * MAX_NAME_LENGTH), "g" * (MAX_NAME_LENGTH + 1))
    assert [e["name"] for e in ex.list_exchanges(as_(capped, "operator"))] == ["x" * MAX_NAME_LENGTH]
    alice_is_served(capped)


def test_a_partition_too_wide_for_its_credentials_memory_is_refused_before_it_is_made(capped):
    write(as_(capped, "operator", name="baseline"), 10)  # a commit: what the service loads once ready is in
    before = capped.rss_bytes()
    with capped.connect(secret=SECRETS["app-b"]) as conn:
        message = limited(PartitionWriter, conn, "wide", 1 << 16, "HYBRID", exchange="w", attempt="t0")
    assert "65536 subpartitions is refused" in message and "credential 'app-b' holds" in message
    assert "credentialMemoryShare" in message
    assert capped.rss_bytes() - before < 16 << 20  # nothing of the 65,536 subpartitions was made
    alice_is_served(capped)
    with capped.connect() as conn:  # the operator has no share: its wide partition is counted in status
        PartitionWriter(conn, "wide-op", 4096, "HYBRID", exchange="w", attempt="t0")
        assert capped.status()["memory"]["bookkeeping"] >= 4096 * 1024


def test_a_credentials_bounded_partitions_hold_at_most_its_share_and_the_others_write(capped):
    """64 empty PIPELINED_BOUNDED partitions once took the whole budget: they now take their credential's
    share, say they wait for memory, and another credential's bounded write and read go through."""
    conns = [capped.connect(secret=SECRETS["app-b"]) for _ in range(4)]
    try:
        writers = [PartitionWriter(conns[i % 4], f"bounded-{i}", 1, "PIPELINED_BOUNDED", exchange="hog",
                                   attempt="t0", buffer_size=64 << 10, buffers=16) for i in range(64)]
        status = capped.status()
        bob = status["credentials"]["app-b"]
        assert bob["memory_limit"] == 4 << 20
        memory = status["memory"]
        assert memory["used"] + memory["promised"] <= 4 << 20  # bob's buffers and credit: his share, no more
        assert bob["memory"] <= (4 << 20) + memory["bookkeeping"]  # later partitions wait for credit, not refused
        waiting = [p["waiting_for"] for p in status["partitions"] if p["waiting_for"]]
        assert waiting and all("waiting for memory: credential 'app-b' holds" in w for w in waiting)
        a = as_(capped, "app-a", name="alices", partitionType="PIPELINED_BOUNDED", numSubpartitions=1)
        handle = ex.declare_write(a, SCHEMA, overwrite=True)
        import threading

        got: list[int] = []
        desc = ex.describe_exchange(a)
        reader = threading.Thread(target=lambda: got.extend(
            b.num_rows for b in ex.read_subpartition(a, ex.describe_exchange(a), 0)))
        task = ex.ProducerTask(handle, 0, "t0")
        reader.start()
        task.write([pa.record_batch([pa.array(np.arange(200_000, dtype=np.int64))], schema=SCHEMA)])
        wh.commit_write(handle, [task.finish()["partition"]])
        reader.join(30)
        assert not reader.is_alive() and sum(got) == 200_000, desc
        assert len(writers) == 64
    finally:
        for conn in conns:
            conn.close()


def test_a_credential_filling_its_disk_share_leaves_disk_for_the_others(capped):
    b = as_(capped, "app-b", name="big")
    message = ""
    with pytest.raises(REFUSED) as info:
        write(b, 400_000)  # ~3.2 MB: more than bob's 1 MiB share
    message = str(info.value)
    assert "credential 'app-b'" in message and "credentialDiskShare" in message
    write(as_(capped, "app-b", name="small"), 20_000)  # within its share
    alice_is_served(capped)
    assert capped.status()["credentials"]["app-b"]["disk"] <= 1 << 20


def test_a_connection_holds_a_bounded_number_of_subscriptions(capped):
    from sparkflow_exchange.service.rpc_handlers import MAX_SUBSCRIPTIONS

    write(as_(capped, "app-b", name="watched"), 10)
    with capped.connect(secret=SECRETS["app-b"]) as conn:
        for i in range(MAX_SUBSCRIPTIONS):
            conn.call("subscribe", name="watched", topic=f"t{i}")
        message = limited(conn.call, "subscribe", name="watched", topic="one-more")
        assert "MAX_SUBSCRIPTIONS" in message and "'app-b'" in message
        conn.call("subscribe", name="watched", topic="t0")  # the same topic again replaces it
    alice_is_served(capped)
