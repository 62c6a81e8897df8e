"""An exchange's layout is part of what it is, and a failed write changes nothing: a real service on loopback.

The service itself refuses an append with another partitioner, other keys (or the same keys in another
order), another width or partition type, whatever the client: a hand-made ``declare`` is refused as the
Python writer's is. An overwrite keeps the version it replaces until it commits: aborted, the old version
is the exchange again, with its rows.
"""
from __future__ import annotations

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import schema_to_b64
from sparkflow_exchange.calls import call
from sparkflow_exchange.errors import ErrorCode, ExchangeReplaced, InvalidRequest

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("v", pa.string())])


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = list(range(start, start + rows))
    return pa.record_batch([pa.array([i % 50 for i in ids], pa.int64()), pa.array([i % 7 for i in ids], pa.int64()),
                            pa.array([f"r{i}" for i in ids])], schema=SCHEMA)


def write(cfg, rows: pa.RecordBatch, overwrite: bool, tasks: int = 2) -> wh.WriteHandle:
    """A committed write of ``rows`` cut among ``tasks`` producers (the Python writer's own path)."""
    handle = ex.declare_write(cfg, SCHEMA, overwrite=overwrite)
    committed = []
    step = -(-rows.num_rows // tasks)
    for i in range(tasks):
        task = ex.ProducerTask(handle, i, f"attempt-{i}")
        task.write([rows.slice(i * step, step)])
        committed.append(task.finish()["partition"])
    wh.commit_write(handle, committed)
    return handle


def read_all(cfg) -> list[str]:
    desc = ex.describe_exchange(cfg)
    return sorted(v for s in range(desc.num_subpartitions) for b in ex.read_subpartition(cfg, desc, s)
                  for v in b.column("v").to_pylist())


def declare(cfg, name: str, keys: list[str], partitioner: str = "hash", width: int | None = 4,
            partition_type: str = "HYBRID", schema: pa.Schema = SCHEMA) -> dict:
    """A declare framed by hand, as any client may send it."""
    return call(cfg, "declare", name=name, schema=schema_to_b64(schema), num_subpartitions=width,
                partitioner={"name": partitioner, "keys": keys, "custom": None, "shared": False},
                partition_type=partition_type, mode="append", coalesce=False)


def test_an_append_with_other_keys_is_refused_naming_both_layouts_and_changes_nothing(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="layout", keys="a", numSubpartitions=4)
    write(cfg, batch(0, 40), overwrite=True)
    with pytest.raises(InvalidRequest, match=r"with another layout: the exchange holds hash\(a\) into 4 "
                                             r"subpartitions, HYBRID, this write has hash\(b\) into 4") as caught:
        write(cfg.replace(keys=("b",)), batch(40, 40), overwrite=False)  # the Python writer
    assert caught.value.code == ErrorCode.LAYOUT_MISMATCH
    desc = ex.describe_exchange(cfg)
    assert desc.partitioner.keys == ("a",) and desc.state == "committed" and desc.rows == 40
    assert read_all(cfg) == sorted(f"r{i}" for i in range(40))
    for keys, partitioner, width, ptype in ((["b"], "hash", 4, "HYBRID"), (["a", "b"], "hash", 4, "HYBRID"),
                                            (["a"], "hash", 8, "HYBRID"), (["a"], "hash", 4, "BLOCKING"),
                                            ([], "rebalance", 4, "HYBRID")):
        with pytest.raises(InvalidRequest, match="with another layout"):
            declare(cfg, "layout", keys, partitioner, width, ptype)
    assert declare(cfg, "layout", ["a"], width=None)["partitioner"]["keys"] == ["a"]  # no width: the exchange's


def test_keys_in_another_order_are_another_layout_and_a_key_spelt_in_another_case_the_same(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="two-keys", keys="a,b", numSubpartitions=4)
    write(cfg, batch(0, 20), overwrite=True)
    with pytest.raises(InvalidRequest, match=r"holds hash\(a, b\) into 4 subpartitions, HYBRID, this write has "
                                             r"hash\(b, a\)"):
        declare(cfg, "two-keys", ["b", "a"])
    # a JVM write may name the key as the user spelt it: Spark resolves 'A' to column a (case-insensitive)
    assert declare(cfg, "two-keys", ["A", "B"])["epoch"] >= 1
    cased = pa.schema([("k", pa.int64()), ("K", pa.int64()), ("v", pa.string())])
    cfg2 = client_config(svc, exchange="cased")
    call(cfg2, "declare", name="cased", schema=schema_to_b64(cased), num_subpartitions=4,
         partitioner={"name": "hash", "keys": ["K"], "custom": None, "shared": False}, partition_type="HYBRID",
         mode="overwrite", coalesce=False)
    with pytest.raises(InvalidRequest, match=r"holds hash\(K\).*this write has hash\(k\)"):
        declare(cfg2, "cased", ["k"], schema=cased)  # k and K are two columns: k is not K


def test_an_overwrite_whose_write_fails_leaves_the_committed_version_readable(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="kept", keys="a", numSubpartitions=4)
    write(cfg, batch(0, 100), overwrite=True)
    before = ex.describe_exchange(cfg)
    handle = ex.declare_write(cfg.replace(keys=("b",)), SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "attempt-0")
    task.write([batch(500, 30)])
    task.finish()
    wh.abort_write(handle, "a task failed")
    after = ex.describe_exchange(cfg)
    assert (after.epoch, after.state, after.rows, after.partitioner.keys) == \
        (before.epoch, "committed", 100, ("a",))
    assert read_all(cfg) == sorted(f"r{i}" for i in range(100))
    # committed, an overwrite replaces the old version, and only then are its partitions released
    write(cfg.replace(keys=("b",)), batch(1000, 10), overwrite=True)
    assert read_all(cfg) == sorted(f"r{i}" for i in range(1000, 1010))
    with pytest.raises(Exception) as gone:
        list(ex.read_subpartition(cfg, before, 0))
    assert "overwritten" in str(gone.value) or isinstance(gone.value, ExchangeReplaced)


def test_a_drop_during_an_overwrite_drops_the_version_set_aside_too(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="dropped", keys="a", numSubpartitions=2)
    write(cfg, batch(0, 10), overwrite=True)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    ex.drop_exchange("dropped", cfg)
    wh.abort_write(handle, "a task failed")
    assert "dropped" not in [e["name"] for e in ex.list_exchanges(cfg)]


def test_a_commit_that_leaves_out_tasks_which_wrote_rows_is_refused(tmp_service):
    """A driver that lost its tasks' commit messages (e.g. read with another class loader) commits fewer
    partitions than its tasks wrote: refused, never an exchange committed empty; the write can still abort."""
    from sparkflow_exchange.errors import DataLost

    svc = tmp_service()
    cfg = client_config(svc, exchange="covered", keys="a", numSubpartitions=4)
    write(cfg, batch(0, 20), overwrite=True)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    parts = []
    for i in range(2):
        task = ex.ProducerTask(handle, i, f"attempt-{i}")
        task.write([batch(100 + 10 * i, 10)])
        parts.append(task.finish()["partition"])
    empty = ex.ProducerTask(handle, 2, "attempt-2")  # a task with no rows may be left out
    empty.finish()
    for named in ([], parts[:1]):
        with pytest.raises(DataLost, match=r"tasks of this write pushed rows and none of their attempts is committed "
                                           r"\(task 0 \(10 rows\)|\(task 1 \(10 rows\)"):
            wh.commit_write(handle, named, {p: 10 for p in named})
    wh.abort_write(handle, "its commit was refused")
    assert read_all(cfg) == sorted(f"r{i}" for i in range(20))  # the committed version is still the exchange
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "attempt-0")
    task.write([batch(200, 5)])
    wh.commit_write(handle, [task.finish()["partition"]], {})
    assert read_all(cfg) == sorted(f"r{i}" for i in range(200, 205))


def test_an_append_to_a_failed_overwrite_is_released_with_it(tmp_service):
    """An append declared on an open overwrite writes that version: the overwrite aborted, the append's producers
    are released at once (not left unknown to every later drop) and its commit is refused; the committed version
    stays the exchange's."""
    svc = tmp_service()
    cfg = client_config(svc, exchange="stacked", keys="a", numSubpartitions=2)
    write(cfg, batch(0, 10), overwrite=True)
    overwrite = ex.declare_write(cfg, SCHEMA, overwrite=True)
    append = ex.declare_write(cfg, SCHEMA, overwrite=False)
    task = ex.ProducerTask(append, 0, "attempt-0")
    task.write([batch(100, 5)])
    part = task.finish()["partition"]
    wh.abort_write(overwrite, "a task failed")
    with pytest.raises(ExchangeReplaced):
        wh.commit_write(append, [part])
    assert read_all(cfg) == sorted(f"r{i}" for i in range(10))
    ex.drop_exchange("stacked", cfg)
    with svc.connect() as conn:
        assert conn.call("status")["partitions"] == []  # nothing left that no drop could reach
