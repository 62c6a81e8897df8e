"""Owners: an exchange belongs to the credential that declared it (docs/deployment.md, credentials and owners).

One real service with its own secret (the operator credential) and two application credentials from its
``credentialsFile``: the second application cannot drop, release, overwrite, append to, commit or abort
the first one's exchange, nor stop the service; it can read it; the owner and the operator can do all.
"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config, start_service

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.calls import call
from sparkflow_exchange.errors import ExchangeError
from sparkflow_exchange.network.blocking_client import ServiceError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
SECRETS = {"app-a": "secret-of-a-0123456789", "app-b": "secret-of-b-0123456789"}
REFUSED = (ExchangeError, ServiceError)


@pytest.fixture
def shared(tmp_path):
    """A service shared by two applications (and its operator)."""
    creds = tmp_path / "credentials"
    creds.write_text("# name secret\n" + "".join(f"{n} {s}\n" for n, s in SECRETS.items()))
    creds.chmod(0o600)
    svc = start_service(tmp_path / "svc", conf={"credentialsFile": str(creds)})
    yield svc
    svc.stop()


def as_(svc, who: str, name: str = "orders", **kw):
    secret = svc.secret if who == "operator" else SECRETS[who]
    opts = dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=2, partitionType="HYBRID",
                secret=secret, hostId="elsewhere", readerTimeout="30s")
    opts.update(kw)
    return client_config(svc, **opts)


def write(config, rows: int, overwrite: bool = True) -> wh.WriteHandle:
    handle = ex.declare_write(config, SCHEMA, overwrite=overwrite)
    task = ex.ProducerTask(handle, 0, "t0")
    task.write([pa.record_batch([pa.array(np.arange(rows, dtype=np.int64))], schema=SCHEMA)])
    wh.commit_write(handle, [task.finish()["partition"]])
    return handle


def rows_of(config) -> int:
    desc = ex.describe_exchange(config)
    return sum(b.num_rows for sub in range(2) for b in ex.read_subpartition(config, desc, sub))


def test_another_credential_can_read_but_not_change_an_exchange(shared):
    a, b = as_(shared, "app-a"), as_(shared, "app-b")
    write(a, 1000)
    assert ex.describe_exchange(b).owner == "app-a"
    assert rows_of(b) == 1000  # every credential may read every exchange

    with pytest.raises(REFUSED, match="belongs to credential 'app-a'.*authenticated as 'app-b'"):
        ex.drop_exchange("orders", b)
    with pytest.raises(REFUSED, match="belongs to credential 'app-a'"):
        ex.declare_write(b, SCHEMA, overwrite=True)
    with pytest.raises(REFUSED, match="belongs to credential 'app-a'"):
        ex.declare_write(b, SCHEMA, overwrite=False)  # an append changes it too
    assert rows_of(a) == 1000 and ex.describe_exchange(a).owner == "app-a"


def test_another_credential_cannot_commit_abort_or_join_a_write(shared):
    a, b = as_(shared, "app-a"), as_(shared, "app-b")
    handle = ex.declare_write(a, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "t0")
    task.write([pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], schema=SCHEMA)])
    part = task.finish()["partition"]
    theirs = wh.WriteHandle(b, handle.name, handle.epoch, handle.write_id, handle.schema_b64,
                            handle.num_subpartitions, handle.partitioner)
    with pytest.raises(REFUSED, match="aborting a write of exchange 'orders' is refused"):
        from sparkflow_exchange.calls import call

        call(b, "abort", name="orders", epoch=handle.epoch, write_id=handle.write_id, reason="mischief")
    with pytest.raises(REFUSED, match="committing a write of exchange 'orders' is refused"):
        wh.commit_write(theirs, [part])
    with pytest.raises(REFUSED, match="writing exchange 'orders' is refused"):
        ex.ProducerTask(theirs, 1, "t1")
    wh.commit_write(handle, [part])
    assert rows_of(b) == 100


def test_another_credential_cannot_release_partitions_or_stop_the_service(shared):
    a, b = as_(shared, "app-a"), as_(shared, "app-b")
    write(a, 500)
    partitions = [p["partition"] for p in shared.status()["partitions"]]
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        with pytest.raises(ServiceError, match="releasing partition '.*' is refused: it was registered by "
                                               "credential 'app-a' and this connection authenticated as 'app-b'"):
            conn.call("release_partitions", partitions=partitions, reason="mischief")
        with pytest.raises(ServiceError, match="stopping the service needs the operator credential"):
            conn.call("shutdown")
        with pytest.raises(ServiceError, match="needs the operator credential"):
            conn.call("attach_app", app="app-x", pid=1)
        assert conn.call("ping")["service_id"]  # still served
    assert shared.proc.poll() is None
    assert rows_of(b) == 500


def test_the_owner_and_the_operator_may_change_it(shared):
    a, op = as_(shared, "app-a"), as_(shared, "operator")
    write(a, 10)
    write(a, 20, overwrite=False)  # the owner appends
    assert rows_of(a) == 30
    ex.drop_exchange("orders", a)  # the owner drops
    write(a, 10)
    write(op, 40)  # the operator overwrites: the new exchange is the operator's
    assert ex.describe_exchange(a).owner == "operator"
    with pytest.raises(REFUSED, match="belongs to credential 'operator'"):
        ex.drop_exchange("orders", a)
    ex.drop_exchange("orders", op)
    with shared.connect() as conn:  # the service's own secret may stop it
        assert conn.call("shutdown") == {"ok": True}
    assert shared.proc.wait(30) == 0


def test_an_unknown_secret_is_refused(shared):
    with pytest.raises(REFUSED, match="wrong secret"):
        ex.list_exchanges(as_(shared, "app-a", secret="not-a-credential"))


@pytest.mark.parametrize("content,message", [
    ("app-a\n", "line 1: expected 'name secret', got 1 fields"),
    ("operator s3cret\n", "line 1: 'operator' is the name of the service's own secret"),
    ("x one\nx two\n", "line 2: credential 'x' is listed twice"),
    ("x same\ny same\n", "line 2: credential 'y' has the same secret as another credential"),
])
def test_a_bad_credentials_file_stops_the_service_with_a_clear_error(tmp_path, content, message):
    creds = tmp_path / "credentials"
    creds.write_text(content)
    creds.chmod(0o600)
    (tmp_path / "secret").write_text("operator-secret")
    (tmp_path / "secret").chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.service", "--port", "0",
                           "--secret-file", str(tmp_path / "secret"), "--spill-dir", str(tmp_path / "spill"),
                           "--conf", f"credentialsFile={creds}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


# ------------------------------------------------------------------ partitions and consumer groups
from sparkflow_exchange.buffer_kinds import epoch_marker  # noqa: E402
from sparkflow_exchange.errors import ErrorCode  # noqa: E402
from sparkflow_exchange.spark import streaming as st  # noqa: E402


def refused_as_forbidden(fn, *args, **kw) -> str:
    """Run a call that must be refused with ``forbidden``; its message."""
    with pytest.raises(REFUSED) as info:
        fn(*args, **kw)
    assert info.value.code == ErrorCode.FORBIDDEN, info.value
    return str(info.value)


def test_a_stranger_cannot_take_anothers_partitions_into_its_own_exchange(shared):
    """Registering the owner's committed partition ids as producers of one's own exchange, then dropping that,
    must not release the owner's data."""
    a, b = as_(shared, "app-a"), as_(shared, "app-b", name="bobs")
    write(a, 1000)
    producers = ex.describe_exchange(a).producers
    handle = ex.declare_write(b, SCHEMA, overwrite=True)
    for index, p in enumerate(producers):
        message = refused_as_forbidden(call, b, "register_producer", name="bobs", epoch=handle.epoch,
                                       write_id=handle.write_id, index=index, attempt="x",
                                       partition=p["partition"], location=p["location"])
        assert "app-a" in message and p["partition"] in message
    ex.drop_exchange("bobs", b)
    assert rows_of(a) == 1000
    listed = [e for e in ex.list_exchanges(a) if e["name"] == "orders"][0]
    assert listed["rows"] == 1000


def test_a_partition_joins_one_exchange_only(shared):
    """Even its own credential (or the operator) cannot make one partition a producer of two exchanges: dropping
    the second would release the first one's data."""
    a, op = as_(shared, "app-a"), as_(shared, "operator", name="other")
    write(a, 100)
    p = ex.describe_exchange(a).producers[0]
    for config in (as_(shared, "app-a", name="other"), op):
        handle = ex.declare_write(config, SCHEMA, overwrite=True)
        with pytest.raises(REFUSED, match="already a producer of exchange 'orders'"):
            call(config, "register_producer", name="other", epoch=handle.epoch, write_id=handle.write_id, index=0,
                 attempt="x", partition=p["partition"], location=p["location"])
        ex.drop_exchange("other", op)
    assert rows_of(a) == 100


def stream_as(svc, who: str, **kw):
    return as_(svc, who, name="events", numSubpartitions=2, **kw)


def write_epochs(config, epochs: range) -> None:
    handle = st.declare_stream(config, SCHEMA)
    for epoch in epochs:
        wh = st.begin_epoch(handle, epoch, "query-a")
        task = ex.ProducerTask(wh, 0, f"{epoch}-0")
        task.write([pa.record_batch([pa.array(np.arange(epoch * 10, epoch * 10 + 10), pa.int64())], schema=SCHEMA)])
        result = task.finish(epoch_marker(epoch))
        st.commit_epoch(handle, epoch, [result["partition"]], {result["partition"]: result["rows"]})


def read_epochs(config, group: str, after: int) -> tuple[int, list[int]]:
    end = st.latest_epoch(config, group, after)["epoch"]
    plan = st.plan_epochs(config, after, end)
    ids = [i for sub in range(2) for b in st.read_epochs(config, SCHEMA, plan["epochs"], sub)
           for i in b.column("id").to_pylist()]
    return end, sorted(ids)


def test_a_stranger_cannot_commit_leave_join_or_advance_anothers_consumer_group(shared):
    a, b = stream_as(shared, "app-a"), stream_as(shared, "app-b")
    write_epochs(a, range(3))
    group = st.join_group(a, "a-readers")["group"]
    end, ids = read_epochs(a, group, -1)
    assert end == 2 and ids == list(range(30))
    st.commit_group(a, group, 0)  # alice is done with epoch 0 only: 1 and 2 stay retained for her
    write_epochs(a, range(3, 4))

    refused_as_forbidden(st.commit_group, b, group, 3)
    refused_as_forbidden(st.leave_group, b, group)
    refused_as_forbidden(st.join_group, b, group)
    refused_as_forbidden(st.latest_epoch, b, group, 3)
    described = call(a, "stream_describe", name=a.exchange, wait=0.0)  # the groups, as the coordinator holds them
    assert described["groups"][group]["position"] == 0 and described["released_upto"] == 0

    end, ids = read_epochs(a, group, 0)  # her retained epochs are all there
    assert end == 3 and ids == list(range(10, 40))
    mine = st.join_group(b, "b-readers")["group"]  # bob reads with a group of his own
    assert read_epochs(b, mine, 2) == (3, list(range(30, 40)))
    st.commit_group(b, mine, 3)
    st.leave_group(b, mine)
    st.commit_group(a, group, 3)  # the owner (and the operator) may
    st.leave_group(stream_as(shared, "operator"), group)


# ------------------------------------------------------------------ the whole RPC table, as a stranger
from sparkflow_exchange.buffer import schema_to_b64  # noqa: E402
from sparkflow_exchange.network.rpc import RPCS, Who  # noqa: E402


def snapshot(svc) -> dict:
    """What a stranger's call could change: every exchange, stream, group and partition (clocks aside)."""
    status = svc.status()
    exchanges = []
    for e in status["exchanges"]:
        e = {k: v for k, v in e.items() if k not in ("last_used_at",)}
        if "groups" in e:
            e["groups"] = {g: {k: v for k, v in d.items() if k != "idle_s"} for g, d in e["groups"].items()}
        exchanges.append(e)
    partitions = [{k: v for k, v in p.items() if k != "age_seconds"} for p in status["partitions"]]
    return {"exchanges": exchanges, "partitions": partitions, "apps": status["apps"],
            "services": [s["service_id"] for s in status["services"]]}


OPEN_HERE = (Who.ANY, Who.READER)


def test_a_stranger_is_refused_every_state_changing_call_of_the_table_and_changes_nothing(shared):
    """Every RPC of the table, called by a second credential against the first one's objects: each one the
    table does not open to any credential is refused with ``forbidden``; afterwards nothing changed."""
    a = as_(shared, "app-a")
    write(a, 300)
    orders = ex.describe_exchange(a)
    partition = orders.producers[0]["partition"]
    pending = ex.declare_write(as_(shared, "app-a", name="pending"), SCHEMA, overwrite=True)  # a write left open
    write_epochs(stream_as(shared, "app-a"), range(3))
    events = stream_as(shared, "app-a")
    group = st.join_group(events, "a-readers")["group"]
    st.commit_group(events, group, 0)
    schema = schema_to_b64(SCHEMA)
    partitioner = {"name": "hash", "keys": ["id"], "custom": None, "shared": False}
    declared = dict(schema=schema, num_subpartitions=2, partitioner=partitioner, partition_type="HYBRID")
    of_pending = dict(name="pending", epoch=pending.epoch, write_id=pending.write_id)
    samples = {
        "ping": {}, "status": {}, "shutdown": {}, "list_services": {}, "list_exchanges": {},
        "release_partitions": {"partitions": [partition], "reason": "mischief"},
        "attach_app": {"app": "app-x", "pid": 1},
        "report_file_reads": {"bytes": 0},
        "report_backpressure": {"partition": partition, "seconds": 99.0},
        "set_partition_readers": {"partition": partition, "readers": ["app-b"]},
        "register_service": {"service_id": "svc-fake", "host_id": "h", "tcp": "127.0.0.1:1", "unix": "unix:/x",
                             "pid": 1},
        "service_heartbeat": {"service_id": orders.producers[0]["location"]["service_id"]},
        "subscribe": {"name": "orders", "topic": "t"}, "unsubscribe": {"topic": "t"},
        "declare": {"name": "orders", **declared, "mode": "overwrite"},
        "register_producer": {**of_pending, "index": 0, "attempt": "x", "partition": "bobs-own",
                              "location": orders.producers[0]["location"]},
        "producer_finished": {"name": "orders", "epoch": orders.epoch, "partition": partition},
        "producer_failed": {"name": "orders", "epoch": orders.epoch, "partition": partition, "reason": "mischief"},
        "commit": {**of_pending, "partitions": []},
        "abort": {**of_pending, "reason": "mischief"},
        "drop": {"name": "orders"},
        "get_exchange": {"name": "orders"},
        "stream_declare": {"name": "events", **declared},
        "stream_begin_epoch": {"name": "events", "epoch": 3, "query": "query-a", "run": "r"},
        "stream_commit_epoch": {"name": "events", "epoch": 3, "partitions": []},
        "stream_abort_epoch": {"name": "events", "epoch": 2},
        "stream_describe": {"name": "events"},
        "stream_join": {"name": "events", "group": group},
        "stream_latest": {"name": "events", "group": group, "after": 2},
        "stream_plan": {"name": "events", "after": 0, "upto": 2},
        "stream_commit_group": {"name": "events", "group": group, "epoch": 2},
        "stream_leave": {"name": "events", "group": group},
    }
    assert set(samples) == set(RPCS), "every RPC of the table needs a sample here"
    before = snapshot(shared)
    refused, answered = [], []
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        for method, row in RPCS.items():
            try:
                conn.call(method, **samples[method])
            except ServiceError as exc:
                if exc.code == ErrorCode.FORBIDDEN:
                    assert "app-b" in str(exc), (method, str(exc))
                    refused.append(method)
                    continue
                assert row.who in OPEN_HERE, (method, exc.code, str(exc))
            answered.append(method)
    # her exchange and stream name no readers: every credential may read them (test_hostile_data_plane: readers)
    assert sorted(refused) == sorted(m for m, row in RPCS.items() if row.who not in OPEN_HERE)
    assert shared.proc.poll() is None
    assert snapshot(shared) == before
    assert rows_of(a) == 300
    wh.commit_write(pending, [])
    end, ids = read_epochs(events, group, 0)
    assert end == 2 and ids == list(range(10, 30))


def test_a_service_holding_partitions_for_a_coordinator_frees_only_what_the_releasing_credential_registered(
        shared, tmp_path):
    """A partition on another service is not checked when it joins (the coordinator would need a round trip):
    a stranger who names it first gets it into its exchange, but dropping that releases nothing of it, since
    the holding service frees a partition only for the credential that registered it."""
    from harness import start_service

    from sparkflow_exchange.writer.partition_writer import PartitionWriter

    holder = start_service(tmp_path / "holder", coordinator=False, host_id="hostB",
                           conf={"credentialsFile": str(tmp_path / "credentials"), "coordinator": shared.tcp})
    try:
        with holder.connect(secret=SECRETS["app-a"]) as conn:
            location = conn.call("ping")
            PartitionWriter(conn, "alices-part", 2, "HYBRID", exchange="orders", attempt="t0")
            b = as_(shared, "app-b", name="bobs")
            handle = ex.declare_write(b, SCHEMA, overwrite=True)
            call(b, "register_producer", name="bobs", epoch=handle.epoch, write_id=handle.write_id, index=0,
                 attempt="x", partition="alices-part", location=location)
            ex.drop_exchange("bobs", b)  # the coordinator asks the holder to release it for app-b
            held = [p["partition"] for p in holder.status()["partitions"]]
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and "alices-part" in held and not released_note(holder):
                time.sleep(0.05)
                held = [p["partition"] for p in holder.status()["partitions"]]
            assert "alices-part" in held
            assert released_note(holder)
    finally:
        holder.stop()


def released_note(svc) -> bool:
    return "was not released for credential 'app-b': credential 'app-a' registered it" in \
        (svc.home / "service.log").read_text()


def test_a_producer_names_a_partition_its_service_holds(shared):
    """A partition the coordinator's own service does not hold (never registered, or released) cannot join."""
    b = as_(shared, "app-b", name="bobs")
    handle = ex.declare_write(b, SCHEMA, overwrite=True)
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        location = conn.call("ping")
    with pytest.raises(REFUSED, match="partition 'made-up' is not held by the service its location names") as info:
        call(b, "register_producer", name="bobs", epoch=handle.epoch, write_id=handle.write_id, index=0,
             attempt="x", partition="made-up", location=location)
    assert info.value.code == ErrorCode.BAD_REQUEST
    assert ex.describe_exchange(b).producers == ()
