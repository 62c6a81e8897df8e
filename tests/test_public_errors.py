"""Faults reach users as documented classes of ``sparkflow_exchange`` with the cause in the message."""
from __future__ import annotations

import resource
import signal

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

import sparkflow_exchange as sfx
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh

SCHEMA = pa.schema([pa.field("a", pa.int64()), pa.field("pad", pa.string())])


def batch(rows: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(np.arange(rows)), pa.array(["x" * 100] * rows)], schema=SCHEMA)


def test_a_service_killed_mid_write_is_service_unavailable(tmp_service):
    svc = tmp_service()
    cfg = client_config(svc, exchange="doomed", keys="a", numSubpartitions=2, partitionType="HYBRID")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([batch(1000)])
    assert svc.stop(signal.SIGKILL) == -signal.SIGKILL
    with pytest.raises(sfx.ServiceUnavailable, match=f"exchange service at {svc.tcp}") as info:
        for _ in range(100):  # the kernel may take a few sends to notice the peer is gone
            task.write([batch(1000)])
        task.finish()
    assert type(info.value).__module__ == "sparkflow_exchange"
    assert info.value.code in (sfx.ErrorCode.CONNECTION_LOST, sfx.ErrorCode.UNREACHABLE)


def test_storage_that_refuses_a_write_is_a_storage_error_and_the_service_goes_on(tmp_service):
    """The service's spill files may grow to 64 KiB only (as a full disk would refuse them): the write fails
    with the system's reason, other requests are still served."""
    svc = tmp_service()
    _soft, hard = resource.prlimit(svc.proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(svc.proc.pid, resource.RLIMIT_FSIZE, (64 * 1024, hard))
    cfg = client_config(svc, exchange="big", keys="a", numSubpartitions=2, partitionType="HYBRID",
                        bufferSize="32k")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    with pytest.raises(sfx.StorageError, match=r"refused partition .*File too large") as info:
        task.write([batch(5000)])
        task.finish()
    assert info.value.code is sfx.ErrorCode.STORAGE
    task.fail("storage")
    with svc.connect() as conn:
        assert conn.call("ping")["service_id"]
    resource.prlimit(svc.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
    cfg = client_config(svc, exchange="small", keys="a", numSubpartitions=2, partitionType="HYBRID")
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([batch(10)])
    wh.commit_write(handle, [task.finish()["partition"]])
    desc = ex.describe_exchange(cfg)
    assert sum(b.num_rows for s in range(2) for b in ex.read_subpartition(cfg, desc, s)) == 10


def test_a_refusal_of_the_coordinator_is_its_class(tmp_service):
    svc = tmp_service()
    with pytest.raises(sfx.ExchangeNotFound, match="exchange 'nobody-wrote-this' does not exist"):
        ex.describe_exchange(client_config(svc, exchange="nobody-wrote-this", declareTimeout="0.1"))
    cfg = client_config(svc, exchange="w", keys="a", numSubpartitions=2)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    wh.commit_write(handle, [])
    with pytest.raises(sfx.InvalidRequest, match="is not open"):
        wh.commit_write(handle, [])
