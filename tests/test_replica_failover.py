"""Replicas with real services on loopback, told apart as hosts by their host ids: a replicated exchange is
read to the last row exactly once when the service holding a partition is killed -9 before or during the read,
by a reader started after the loss too; a write whose replica's service dies fails naming it, and its retry
places the replica on a live service; a cluster of one host refuses the option at write time.
(tests/test_multihost_replicas.py does the same across network-namespace hosts.)"""
from __future__ import annotations

import collections
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import start_service

import sparkflow_exchange as sfe

FAST = {"heartbeatInterval": "0.2s", "heartbeatTimeout": "1s"}
SCHEMA = pa.schema([("id", pa.int64()), ("w", pa.int64())])
ROWS = 40_000


def _batch(first: int, n: int, writer: int) -> pa.RecordBatch:
    ids = np.arange(first, first + n, dtype=np.int64)
    return pa.record_batch([pa.array(ids), pa.array(np.full(n, writer, dtype=np.int64))], schema=SCHEMA)


def _until(what: str, check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return got


@pytest.fixture
def hosts(tmp_path):
    """Three services: A (the coordinator) and the workers B and C, each its own host id."""
    a = start_service(tmp_path / "a", host_id="hostA", conf=FAST)
    started = [a]
    try:
        for name in ("b", "c"):
            started.append(start_service(tmp_path / name, coordinator=False, host_id=f"host{name.upper()}",
                                         conf={**FAST, "coordinator": a.tcp}))
        _until("the workers registered", lambda: sum(s["state"] == "alive" for s in a.status()["services"]) == 3)
        yield started
    finally:
        for svc in started:
            if svc.proc.poll() is None:
                svc.stop()


def _settings(coordinator, service=None, **more) -> dict:
    """A client on a host of its own (every read goes over TCP); it writes into ``service``."""
    return {"coordinator": coordinator.tcp, "service": (service or coordinator).tcp, "secret": coordinator.secret,
            "hostId": "client-host", "bufferSize": "16k", "sortBufferSize": "64k", "compression": "none", **more}


def _write(name: str, coordinator, service, writer: int, mode: str = "overwrite") -> None:
    with sfe.open_writer(name, SCHEMA, keys=["id"], num_subpartitions=2, mode=mode, replicas=1,
                         **_settings(coordinator, service)) as w:
        for first in range(0, ROWS, 2_000):
            w.write(_batch(writer * ROWS + first, 2_000, writer))


def _kill(svc) -> None:
    os.kill(svc.proc.pid, signal.SIGKILL)
    svc.proc.wait(30)


def _exchange(coordinator, name: str) -> dict:
    return next(e for e in coordinator.status()["exchanges"] if e["name"] == name)


def _ids(batches) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for b in batches:
        seen.update(b.column("id").to_numpy().tolist())
    return seen


EXPECTED = collections.Counter(range(2 * ROWS))


def test_a_read_goes_on_from_the_replica_when_the_service_dies_mid_read(hosts):
    a, b, c = hosts
    _write("rep", a, b, 0)  # held by B, its copy on A or C
    _write("rep", a, c, 1, mode="append")  # held by C
    desc = _exchange(a, "rep")
    assert desc["replicas"] == 1 and desc["replication"]["replicated"] == 2, desc["replication"]
    on_b = [p for p in desc["producers"] if p["location"]["host_id"] == "hostB"]
    assert len(on_b) == 1 and on_b[0]["replicas"][0]["location"]["host_id"] != "hostB"
    assert on_b[0]["replicas"][0]["state"] == "complete"
    got: list = []
    with sfe.open_reader("rep", subpartitions=0, **_settings(a, buffersPerChannel=1, floatingBuffersPerGate=1)) as r:
        while not any(0 in batch.column("w").to_numpy() for batch in got):  # B's partition is being read
            got.append(r.read_next_batch())
        _kill(b)  # mid-read: with one credit and one floating buffer, most of B's buffers are still at B
        after_kill = list(r)
        got.extend(after_kill)
    assert sum(int((batch.column("w").to_numpy() == 0).sum()) for batch in after_kill) > ROWS // 4
    rest = list(sfe.open_reader("rep", subpartitions=1, **_settings(a)))  # before the coordinator knows
    seen = _ids(got) + _ids(rest)
    assert seen == EXPECTED, (len(seen), sum(seen.values()))
    # the coordinator finds B lost: B's partition is read from its copy, the copies B held are gone
    after = _until("B's partition failed over", lambda: _exchange(a, "rep")["replication"]["failed_over"] == 1 and
                   _exchange(a, "rep"))
    # C's own partition (B's, failed over, may be on C now too)
    on_c = next(p for p in after["producers"] if p["location"]["host_id"] == "hostC" and not p["failed_over"])
    c_copy_lost = on_c["replicas"][0]["location"]["host_id"] == "hostB"
    assert on_c["replicas"][0]["state"] == ("lost" if c_copy_lost else "complete")
    assert after["replication"] == {"partitions": 2, "replicated": 0 if c_copy_lost else 1,
                                    "under_replicated": 2 if c_copy_lost else 1, "failed_over": 1}
    # a reader started after the loss reads every row once, with partition ids (subpartitions) as written
    later = {sub: _ids(sfe.open_reader("rep", subpartitions=sub, **_settings(a))) for sub in (0, 1)}
    assert later[0] + later[1] == EXPECTED
    assert {sub: set(ids) for sub, ids in later.items()} == {sub: set(_ids(got if sub == 0 else rest))
                                                             for sub in (0, 1)}
    from sparkflow_exchange.service.metrics import render

    samples = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in render(a.status()).splitlines()
               if line.startswith("sparkflow_exchange_partitions_") and 'exchange="rep"' in line}
    assert samples == {"sparkflow_exchange_partitions_replicated": "0" if c_copy_lost else "1",
                       "sparkflow_exchange_partitions_under_replicated": "2" if c_copy_lost else "1",
                       "sparkflow_exchange_partitions_failed_over": "1"}, samples


def test_a_write_whose_replica_dies_fails_naming_it_and_its_retry_commits(hosts):
    a, b, c = hosts
    w = sfe.open_writer("rw", SCHEMA, keys=["id"], num_subpartitions=2, replicas=1, **_settings(a, c))
    w.write(_batch(0, 2_000, 0))
    replica = [p for p in _exchange(a, "rw")["producers"]][0]["replicas"][0]["location"]
    victim = b if replica["host_id"] == "hostB" else a if replica["host_id"] == "hostA" else None
    if victim is a:  # the coordinator holds the copy: move the write to B so that killing the copy's service
        w.abort("placed on the coordinator's host")  # leaves the coordinator up
        w = sfe.open_writer("rw", SCHEMA, keys=["id"], num_subpartitions=2, replicas=1, **_settings(a, b))
        w.write(_batch(0, 2_000, 0))
        replica = _exchange(a, "rw")["producers"][0]["replicas"][0]["location"]
        victim = c if replica["host_id"] == "hostC" else None
    assert victim is not None, replica
    _kill(victim)
    with pytest.raises(sfe.ServiceUnavailable) as info:
        for first in range(2_000, 20 * ROWS, 2_000):  # until a push finds the copy's service gone
            w.write(_batch(first, 2_000, 0))
        w.commit()
    message = str(info.value)
    assert info.value.code == "replica_lost" and replica["service_id"] in message, message
    assert "\n" not in message
    _until("the coordinator lost the copy's service", lambda: any(
        s["state"] == "lost" for s in a.status()["services"]))
    # only two hosts are left: the retry places its copy on the live one
    survivor = next(s for s in (b, c) if s is not victim)
    _write("rw", a, survivor, 0)
    desc = _exchange(a, "rw")
    assert desc["replication"]["replicated"] == 1 and desc["rows"] == ROWS
    assert desc["producers"][0]["replicas"][0]["location"]["host_id"] == "hostA"
    assert _ids(sfe.open_reader("rw", **_settings(a))) == collections.Counter(range(ROWS))


def test_a_compressed_exchange_mixing_uncompressed_messages_reads_back_from_its_replica(hosts):
    """A compressed exchange's batches with nothing to compress go as uncompressed messages among the compressed
    ones: the replica holds that mixed stream as it came (sized as its own service counts it), and a reader after
    the loss of the partition's service reads every row once from it."""
    from sparkflow_exchange.buffer import RETRY_AFTER

    a, b, _c = hosts
    rng = np.random.default_rng(5)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    expected: collections.Counter = collections.Counter()
    with sfe.open_writer("mixrep", schema, keys=["id"], num_subpartitions=2, replicas=1,
                         **_settings(a, b, compression="zstd", bufferSize="64k")) as w:
        for i in range(3 * (RETRY_AFTER + 2)):  # runs of random rows, then of counting ids and rounded prices
            counting = i // (RETRY_AFTER + 2) == 1
            ids = np.arange(i * 4096, (i + 1) * 4096, dtype=np.int64) if counting else \
                rng.integers(-2**63, 2**63 - 1, 4096, dtype=np.int64)
            w.write(pa.record_batch([pa.array(ids), pa.array(ids % 1000 * 0.25 if counting else rng.random(4096))],
                                    schema=schema))
            expected.update(ids.tolist())
    [producer] = _exchange(a, "mixrep")["producers"]
    copy = producer["replicas"][0]
    assert producer["location"]["host_id"] == "hostB" and copy["state"] == "complete", producer
    holder = next(s for s in hosts if s.status()["service"]["service_id"] == copy["location"]["service_id"])
    [own] = [p for p in b.status()["partitions"] if p["exchange"] == "mixrep"]
    [kept] = [p for p in holder.status()["partitions"] if p["exchange"] == "mixrep"]
    assert (kept["bytes"], kept["raw_bytes"]) == (own["bytes"], own["raw_bytes"]), (kept, own)
    arrow = 3 * (RETRY_AFTER + 2) * 4096 * 16  # uncompressed messages counted at their size, the others raw
    assert own["bytes"] < own["raw_bytes"] and arrow <= own["raw_bytes"] <= 1.1 * arrow, own
    _kill(b)
    _until("B's partition failed over", lambda: _exchange(a, "mixrep")["replication"]["failed_over"] == 1)
    assert _ids(sfe.open_reader("mixrep", **_settings(a))) == expected


def test_replicas_on_one_host_fail_at_write_time_naming_why(tmp_path):
    a = start_service(tmp_path / "a", host_id="only-host")
    try:
        with pytest.raises(sfe.InvalidRequest) as info:
            sfe.open_writer("one", SCHEMA, keys=["id"], num_subpartitions=2, replicas=1, **_settings(a))
        assert info.value.code == "no_replica_host"
        assert "replicas=1 needs live exchange services on 2 hosts" in str(info.value)
        assert "only-host" in str(info.value)
        assert not any(e["name"] == "one" for e in a.status()["exchanges"])  # nothing was declared
    finally:
        a.stop()


def test_the_jvm_reader_goes_on_from_the_replica_of_a_dead_service(hosts, jar, tmp_path):
    """The jar's reader (outside Spark, as a read task reads) planned before the loss: its partition's service
    refuses, it reads the replica; the rows of each subpartition are the Python reader's, once each."""
    import json
    import shutil

    from jvm_units import compile_driver

    from sparkflow_exchange.calls import call
    from sparkflow_exchange.client import exchange_config

    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    jvm = compile_driver(jar, tmp_path / "jvm")
    a, b, c = hosts
    _write("jrep", a, b, 0)
    _write("jrep", a, c, 1, mode="append")
    planned = call(exchange_config("jrep", **_settings(a)), "get_exchange", name="jrep")  # before the loss
    python = {sub: _ids(sfe.open_reader("jrep", subpartitions=sub, **_settings(a))) for sub in (0, 1)}
    _kill(b)
    for sub in (0, 1):
        [answer] = jvm([{"op": "standalone_read", "describe": json.dumps(planned), "subpartition": sub,
                         "coordinator": a.tcp, "secret": a.secret, "host_id": "client-host", "columns": [0]}])
        assert "error" not in answer, answer
        ids = np.frombuffer(bytes.fromhex(answer["hex"]), dtype="<i8")
        assert collections.Counter(ids.tolist()) == python[sub]
    assert python[0] + python[1] == EXPECTED


@pytest.mark.parametrize("subpartitions", [[0], [0, 1]], ids=["one-channel", "two-channels-at-once"])
def test_the_jvm_reader_goes_on_from_the_replica_when_the_service_dies_mid_read(hosts, jar, tmp_path, subpartitions):
    """The jar's RemoteProducer (what a read task reads a producer on another host with), paused after three
    buffers while the partition's service is killed: it goes on from the replica, every value once, in order; with
    two subpartitions read at once (a read laid out to fewer partitions), every channel resumes where it was."""
    import json
    import shutil
    import threading

    from jvm_units import compile_driver

    from sparkflow_exchange.calls import call
    from sparkflow_exchange.client import exchange_config

    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    jvm = compile_driver(jar, tmp_path / "jvm")
    a, b, _c = hosts
    _write("jmid", a, b, 0)
    desc = call(exchange_config("jmid", **_settings(a)), "get_exchange", name="jmid")
    [producer] = desc["producers"]
    python = [v for sub in subpartitions for batch in sfe.open_reader("jmid", subpartitions=sub, **_settings(a))
              for v in batch.column("id").to_pylist()]
    mid, go = tmp_path / "mid", tmp_path / "go"
    answers: list = []
    reader = threading.Thread(target=lambda: answers.extend(jvm([{
        "op": "remote_read", "describe": json.dumps(desc), "partition": producer["partition"], "subpartitions": subpartitions,
        "secret": a.secret, "host_id": "client-host", "after": 3, "mid": str(mid), "go": str(go)}])))
    reader.start()
    try:
        _until("the JVM reader read three buffers", lambda: mid.exists() or not reader.is_alive(), timeout=120)
        assert mid.exists(), answers
        _kill(b)
        go.write_text("go")
    finally:
        go.write_text("go")
        reader.join(180)
    [answer] = answers
    assert "error" not in answer, answer
    if len(subpartitions) == 1:
        assert answer["values"] == python and len(python) > 3 * 500
    else:  # the channels' buffers interleave as they arrive: every value once
        assert collections.Counter(answer["values"]) == collections.Counter(python) and len(python) > 6 * 500


@pytest.mark.spark
def test_a_spark_write_with_replicas_reads_back_exactly_after_its_service_is_killed(hosts, spark):
    """format("pipelined") with replicas=1: the write tasks push copies, and a Spark read planned after a kill -9
    of the service holding every partition returns each row once, in the partition it was written to."""
    from pyspark.sql import functions as F

    a, b, _c = hosts
    where = {"coordinator": a.tcp, "secret": a.secret, "hostId": "client-host"}
    df = spark.range(0, 8_000, 1, 2).selectExpr("id", "CAST(id % 97 AS INT) AS k", "concat('v', id) AS s")
    w = df.write.format("pipelined").mode("overwrite").option("exchange", "sparkrep")
    for key, value in {**where, "service": b.tcp, "replicas": 1, "keys": "k", "numSubpartitions": 2,
                       "bufferSize": "16k"}.items():
        w = w.option(key, str(value))
    w.save()
    desc = _exchange(a, "sparkrep")
    assert desc["replication"]["replicated"] == 2 and all(
        p["location"]["host_id"] == "hostB" and p["replicas"][0]["location"]["host_id"] != "hostB"
        for p in desc["producers"]), desc["producers"]

    def read():
        r = spark.read.format("pipelined").option("exchange", "sparkrep")
        for key, value in where.items():
            r = r.option(key, value)
        return r.load().withColumn("pid", F.spark_partition_id())

    before = sorted(tuple(r) for r in read().collect())  # (id, k, s, read partition id), each row
    _kill(b)
    after = sorted(tuple(r) for r in read().collect())  # from the replicas, whether the coordinator found B lost
    assert after == before  # by its planning or a channel finds it
    assert [r[0] for r in sorted(before)] == list(range(8_000)) and {r[3] for r in before} == {0, 1}
