"""A service's spill files are bounded (``maxDiskBytes``): exchanges outlive their writers, so forgotten
ones must not fill the disk. A write beyond the bound fails naming the setting; a drop gives the room back."""
from __future__ import annotations

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import ExchangeError
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.network.blocking_client import ServiceError

SCHEMA = pa.schema([pa.field("a", pa.int64())])


def write(cfg, rows: int) -> None:
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    try:
        task.write([pa.record_batch([pa.array(range(rows))], schema=SCHEMA)])
        wh.commit_write(handle, [task.finish()["partition"]])
    except BaseException as exc:
        task.fail(str(exc))
        wh.abort_write(handle, str(exc))
        raise


def test_spill_files_beyond_max_disk_bytes_fail_the_write_naming_it(tmp_service):
    svc = tmp_service(conf={"maxDiskBytes": "300k"})
    cfg = dict(keys="a", numSubpartitions=2, bufferSize="32k", compression="none")  # sizes below are raw bytes
    write(client_config(svc, exchange="small", **cfg), 10_000)  # ~80 KB
    with pytest.raises((ExchangeError, ServiceError), match=r"maxDiskBytes=307200"):
        write(client_config(svc, exchange="large", **cfg), 100_000)  # ~800 KB
    assert svc.status()["disk"]["used"] <= 300 * 1024
    ex.drop_exchange("small", client_config(svc))
    write(client_config(svc, exchange="again", **cfg), 30_000)  # fits once the room is given back
    desc = ex.describe_exchange(client_config(svc, exchange="again"))
    got = sum(b.num_rows for s in range(2) for b in ex.read_subpartition(client_config(svc, exchange="again"), desc, s))
    assert got == 30_000
