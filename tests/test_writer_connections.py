"""Write tasks of one process share their service connection (Spark reuses its Python workers)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from harness import client_config, start_service

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.network.blocking_client import WRITER_CONNECTIONS

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int64())])


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.record_batch([pa.array(ids), pa.array(ids % 97)], schema=SCHEMA)


def write_tasks(cfg, tasks: int, rows: int) -> list:
    """``tasks`` write tasks one after the other, as a Spark worker runs them; the connections they used."""
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    parts, conns = [], []
    for i in range(tasks):
        task = ex.ProducerTask(handle, i, f"{i}-0-{i}")
        conns.append(task.conn)
        task.write([batch(i * rows, rows)])
        parts.append(task.finish()["partition"])
    wh.commit_write(handle, parts)
    return conns


def read_ids(cfg, width: int) -> list[int]:
    desc = ex.describe_exchange(cfg)
    ids = []
    for sub in range(width):
        for b in ex.read_subpartition(cfg, desc, sub):
            ids += b.column("id").to_pylist()
    return sorted(ids)


def test_successive_write_tasks_reuse_one_connection_and_lose_nothing(tmp_service):
    svc = tmp_service()
    WRITER_CONNECTIONS.clear()
    # service on the Unix socket: the shared-memory arena of each partition, its slots announced per handle
    for service in (svc.tcp, svc.unix):
        cfg = client_config(svc, service=service, exchange=f"pooled-{service[:4]}", partitioner="hash", keys="key",
                            numSubpartitions=7, bufferSize="4k")
        conns = write_tasks(cfg, tasks=6, rows=5_000)
        assert all(c is conns[0] for c in conns), "each task opened a connection of its own"
        assert read_ids(cfg, 7) == list(range(6 * 5_000))
    WRITER_CONNECTIONS.clear()


def test_a_pooled_connection_to_a_service_that_restarted_is_replaced(tmp_path):
    WRITER_CONNECTIONS.clear()
    first = start_service(tmp_path)
    try:
        cfg = client_config(first, service=first.unix, exchange="before", partitioner="rebalance", numSubpartitions=2)
        old = write_tasks(cfg, tasks=1, rows=100)[0]
    finally:
        first.stop()
    second = start_service(tmp_path)  # the same Unix socket path: the pool's key for it is the same
    try:
        assert second.unix == first.unix
        cfg = client_config(second, service=second.unix, exchange="after", partitioner="rebalance", numSubpartitions=2)
        new = write_tasks(cfg, tasks=2, rows=100)
        assert new[0] is not old and new[1] is new[0]
        assert read_ids(cfg, 2) == list(range(200))
    finally:
        second.stop()
        WRITER_CONNECTIONS.clear()


def test_a_forked_child_does_not_talk_on_its_parents_pooled_connection(tmp_service):
    import os

    svc = tmp_service()
    WRITER_CONNECTIONS.clear()
    cfg = client_config(svc, exchange="forked", partitioner="rebalance", numSubpartitions=2)
    parent_conn = write_tasks(cfg, tasks=1, rows=100)[0]
    pid = os.fork()
    if pid == 0:  # the child writes its own exchange: a connection of its own, the parent's left alone
        code = 1
        try:
            child_cfg = client_config(svc, exchange="forked-child", partitioner="rebalance", numSubpartitions=2)
            code = 0 if write_tasks(child_cfg, tasks=1, rows=100)[0] is not parent_conn else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again = write_tasks(cfg, tasks=1, rows=100)[0]
    assert again is parent_conn  # still the parent's, and still clean
    assert read_ids(cfg, 2) == list(range(100))
    WRITER_CONNECTIONS.clear()
