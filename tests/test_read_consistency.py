"""A read sees one committed state of its exchange (docs/architecture.md, "What a read sees").

Every timing against a real service: a read planned before the first commit, a read planned while an append
is open whose tasks run before and after later appends, an append committed while a read runs, and an
overwrite or drop while a read runs (the read fails at once, naming which), on each read path: the
coordinator subscription, a read plan served by the service, and local spill files.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.errors import ExchangeReadError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
WIDTH = 4
STRIDE = 1_000_000  # write k holds ids [k * STRIDE, k * STRIDE + rows)
QUICK = 10.0  # what "at once" means here, generously
PATHS = ["remote", "local"]  # every read over TCP from another host, or this host's spill files


def config_for(svc, name: str, where: str, **kw):
    host = "elsewhere" if where == "remote" else svc.info["host_id"]
    opts = dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=WIDTH, partitionType="HYBRID",
                bufferSize="8k", hostId=host, readerTimeout="60s")
    opts.update(kw)
    return client_config(svc, **opts)


def rows_of(write: int, rows: int, producer: int = 0, producers: int = 1) -> pa.RecordBatch:
    """Producer ``producer``'s share of write ``write``: every ``producers``-th id."""
    ids = np.arange(write * STRIDE + producer, write * STRIDE + rows, producers, dtype=np.int64)
    return pa.record_batch([pa.array(ids)], schema=SCHEMA)


def expected(*writes: tuple[int, int]) -> list[int]:
    return sorted(i for w, rows in writes for i in range(w * STRIDE, w * STRIDE + rows))


def write(config, number: int, rows: int, *, overwrite: bool, producers: int = 2, commit: bool = True):
    """Write ``number``: every producer finished; committed unless ``commit`` is False (then the handle and
    the partitions are returned for the test to commit)."""
    handle = ex.declare_write(config, SCHEMA, overwrite=overwrite)
    parts = []
    for p in range(producers):
        task = ex.ProducerTask(handle, p, f"w{number}-{p}")
        task.write([rows_of(number, rows, p, producers)])
        parts.append(task.finish()["partition"])
    if commit:
        wh.commit_write(handle, parts)
    return handle, parts


def read_all(config, desc) -> list[int]:
    return sorted(i for sub in range(WIDTH) for b in ex.read_subpartition(config, desc, sub)
                  for i in b.column("id").to_pylist())


def ids(batches) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


# ------------------------------------------------------------------ one state for every task of a read
@pytest.mark.parametrize("where", PATHS)
def test_tasks_of_a_read_planned_during_an_append_see_the_same_commits(tmp_service, where):
    """The read is planned while append 1 is open; its first task runs once append 1 is committed, its
    other tasks after append 2 was committed too: every task reads writes 0 and 1, none of write 2."""
    svc = tmp_service()
    config = config_for(svc, f"tasks-{where}", where)
    write(config, 0, 3000, overwrite=True)
    handle, parts = write(config, 1, 2000, overwrite=False, commit=False)
    desc = ex.describe_exchange(config)  # the read's plan: not sealed (append 1 is open)
    assert not desc.sealed
    wh.commit_write(handle, parts)
    first = ids(ex.read_subpartition(config, desc, 0))
    write(config, 2, 4000, overwrite=False)
    rest = [i for sub in range(1, WIDTH) for i in ids(ex.read_subpartition(config, desc, sub))]
    assert sorted(first + rest) == expected((0, 3000), (1, 2000))
    assert read_all(config, ex.describe_exchange(config)) == expected((0, 3000), (1, 2000), (2, 4000))


@pytest.mark.parametrize("where", PATHS)
def test_read_planned_before_the_first_commit_ends_at_that_commit(tmp_service, where):
    """A pipelined read of a write in progress ends with that write's commit: an append declared and
    committed while it still runs is not part of it."""
    svc = tmp_service()
    config = config_for(svc, f"first-{where}", where)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    desc = ex.describe_exchange(config)
    assert not desc.sealed and desc.seals == 0
    readers = [ex.read_subpartition(config, desc, sub) for sub in range(WIDTH)]
    task = ex.ProducerTask(handle, 0, "a")
    task.write([rows_of(0, 5000)])
    got = [next(r) for r in readers]  # every read is under way, streaming the running write
    wh.commit_write(handle, [task.finish()["partition"]])
    write(config, 1, 2000, overwrite=False)
    got += [b for r in readers for b in r]
    assert sorted(ids(got)) == expected((0, 5000))


def test_producers_of_a_later_append_never_reach_a_running_read(tmp_service):
    """A read whose state is fixed (its write committed) takes nothing from an append that starts
    while it still runs, not even the buffers that append's running producer has pushed already."""
    svc = tmp_service()
    config = config_for(svc, "later-append", "remote", buffersPerChannel=1, floatingBuffersPerGate=1)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    desc = ex.describe_exchange(config)
    reader = ex.read_subpartition(config, desc, 0)
    task = ex.ProducerTask(handle, 0, "a")
    task.write([rows_of(0, 40_000)])  # many buffers: one credit holds the rest on the service
    got = [next(reader)]
    wh.commit_write(handle, [task.finish()["partition"]])
    sealed = ex.describe_exchange(config)  # a plan of write 0 alone, read at the end for comparison
    later = ex.declare_write(config, SCHEMA, overwrite=False)
    running = ex.ProducerTask(later, 0, "b")
    running.write([rows_of(1, 40_000)])  # pushed while the read above still runs
    got += list(reader)
    assert sorted(ids(got)) == sorted(ids(ex.read_subpartition(config, sealed, 0)))
    wh.commit_write(later, [running.finish()["partition"]])
    assert read_all(config, ex.describe_exchange(config)) == expected((0, 40_000), (1, 40_000))


@pytest.mark.parametrize("where", PATHS)
def test_append_committed_during_a_planned_read_is_not_part_of_it(tmp_service, where):
    svc = tmp_service()
    config = config_for(svc, f"planned-{where}", where)
    write(config, 0, 3000, overwrite=True)
    desc = ex.describe_exchange(config)
    assert desc.sealed
    reader = ex.read_subpartition(config, desc, 0)
    got = [next(reader)]
    write(config, 1, 2000, overwrite=False)
    got += list(reader)
    rest = [i for sub in range(1, WIDTH) for i in ids(ex.read_subpartition(config, desc, sub))]
    assert sorted(ids(got) + rest) == expected((0, 3000))


# ------------------------------------------------------------------ overwrite and drop during a read
def _replace(config, how: str) -> None:
    if how == "dropped":
        ex.drop_exchange(config.exchange, config)
    else:
        write(config, 9, 100, overwrite=True)


def _replace_and_expect_the_read_to_fail(config, how: str, reader) -> None:
    """Drop or overwrite the exchange under a running read: the read's next step fails at once, naming which."""
    _replace(config, how)
    start = time.monotonic()
    with pytest.raises(ExchangeReadError, match=how):
        for _ in reader:
            pass
    assert time.monotonic() - start < QUICK


@pytest.mark.parametrize("how", ["dropped", "overwritten"])
@pytest.mark.parametrize("where,producers", [("remote", 3), ("local", 3), ("local", 1)])
def test_overwrite_or_drop_during_a_planned_read_fails_it_naming_which(tmp_service, where, producers, how):
    """Read plans of a sealed exchange (read by the service, or straight from local spill files: with one
    producer, the file is open and mapped before the drop, and the read's end finds it gone)."""
    svc = tmp_service()
    config = config_for(svc, f"gone-{where}-{how[:4]}", where, buffersPerChannel=1, floatingBuffersPerGate=1)
    write(config, 0, 40_000, overwrite=True, producers=producers)
    desc = ex.describe_exchange(config)
    reader = ex.read_subpartition(config, desc, 0)
    next(reader)
    _replace_and_expect_the_read_to_fail(config, how, reader)
    # a task of the same plan that starts afterwards is told too
    with pytest.raises(ExchangeReadError, match=how):
        list(ex.read_subpartition(config, desc, 1))


@pytest.mark.parametrize("how", ["dropped", "overwritten"])
def test_overwrite_or_drop_during_a_pipelined_read_fails_it_naming_which(tmp_service, how):
    svc = tmp_service()
    config = config_for(svc, f"gone-pipelined-{how[:4]}", "remote", buffersPerChannel=1, floatingBuffersPerGate=1)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    desc = ex.describe_exchange(config)
    reader = ex.read_subpartition(config, desc, 0)
    task = ex.ProducerTask(handle, 0, "a")
    task.write([rows_of(0, 20_000)])
    next(reader)
    _replace_and_expect_the_read_to_fail(config, how, reader)


@pytest.mark.parametrize("how", ["dropped", "overwritten"])
def test_a_pipelined_read_task_starting_after_a_drop_or_overwrite_is_told_which(tmp_service, how):
    svc = tmp_service()
    config = config_for(svc, f"late-task-{how[:4]}", "remote")
    ex.declare_write(config, SCHEMA, overwrite=True)
    desc = ex.describe_exchange(config)  # planned while the write is open: its tasks subscribe
    _replace(config, how)
    with pytest.raises(ExchangeReadError, match=how):
        list(ex.read_subpartition(config, desc, 0))
