"""A finished re-readable partition on this host is read straight from its spill file."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def _write(config, rows: int) -> None:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    ids = pa.array(range(rows), pa.int64())
    producer.write([pa.record_batch([ids, pa.compute.cast(ids, pa.string())], schema=SCHEMA)])
    wh.commit_write(handle, [producer.finish()["partition"]])


@pytest.mark.parametrize("partition_type", ["BLOCKING", "HYBRID"])
def test_same_host_reads_the_spill_file_other_hosts_the_network(tmp_service, partition_type):
    svc = tmp_service(host_id="hostA")
    base = dict(exchange=f"file-{partition_type}", partitioner="hash", keys="id", numSubpartitions=3,
                bufferSize="8k", partitionType=partition_type)
    _write(client_config(svc, hostId="hostA", **base), 30_000)
    for host, via_network in (("hostA", False), ("hostB", True)):
        config = client_config(svc, hostId=host, **base)
        desc = ex.describe_exchange(config)
        before = svc.status()["traffic"]
        ids = sorted(i for sub in range(3) for b in ex.read_subpartition(config, desc, sub) for i in b.column("id").to_pylist())
        assert ids == list(range(30_000))
        after = svc.status()["traffic"]
        served = after["local"] + after["remote"] - before["local"] - before["remote"]
        assert (served > 0) == via_network, (host, before, after)
        if not via_network:  # the reader tells its service what it read from the spill files
            deadline = time.monotonic() + 5
            while svc.status()["traffic"]["local_file"] == before["local_file"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert svc.status()["traffic"]["local_file"] > before["local_file"]
