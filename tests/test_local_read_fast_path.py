"""The local-file fast path: a planned read whose every producer is a finished spill file on this host.

The task thread reads the files itself (no IO thread), large buffers come zero-copy from a read-only
mapping, and every check of the channel path still applies (checksums, counts, truncation).
"""
from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer_kinds import BufferKind
from sparkflow_exchange.consumer.input_gate import InputGate
from sparkflow_exchange.consumer.spill_data import MAP_MIN, OPEN_FILES, open_spill_data
from sparkflow_exchange.description import ExchangeDescription
from sparkflow_exchange.errors import ExchangeReadError
from sparkflow_exchange.partition.spill import INDEX_MAGIC, SpillCorruptError, read_index

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
SUBS = 3


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = pa.array(np.arange(start, start + rows, dtype=np.int64))
    return pa.record_batch([ids, pa.compute.cast(ids, pa.string())], schema=SCHEMA)


def write(config, producers: int, rows: int) -> None:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    done = {}
    for p in range(producers):
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write([batch(p * rows, rows)])
        result = task.finish()
        done[result["partition"]] = result["rows"]
    wh.commit_write(handle, list(done), done)


def gate_of(svc, config, sub: int, desc: ExchangeDescription | None = None) -> InputGate:
    """A read-plan gate as ``read_subpartition`` makes it (kept, to look at its stats)."""
    desc = desc or ex.describe_exchange(config)
    return InputGate(config, desc, sub, svc.tcp, svc.secret, config.host_id, local_service=svc.unix,
                     producers=desc.sealed_producers())


def options(name: str, **extra) -> dict:
    return dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=SUBS, **extra)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("partition_type", ["HYBRID", "BLOCKING"])
def test_a_local_plan_is_read_on_the_task_thread_and_a_mixed_one_through_channels(tmp_service, partition_type):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", service=svc.unix,
                           **options(f"fast-{partition_type}", partitionType=partition_type, bufferSize="8k"))
    write(config, 4, 5_000)
    desc = ex.describe_exchange(config)
    ids = []
    for sub in range(SUBS):
        gate = gate_of(svc, config, sub, desc)
        reader = iter(gate)
        first = next(reader)
        assert gate._runtime is None  # no IO thread was asked for anything: no event loop, no asyncio task
        ids += first.column("id").to_pylist() + [i for b in reader for i in b.column("id").to_pylist()]
        stats = gate.stats()
        assert stats["path"] == "local files"
        assert {c["locality"] for c in stats["channels"]} == {"local-file"} and len(stats["channels"]) == 4
        assert {c["state"] for c in stats["channels"]} == {"finished"}
    assert sorted(ids) == list(range(20_000))

    # one producer elsewhere (its location names another host): the whole gate goes through channels
    elsewhere = {**desc.producers[0], "location": {**desc.producers[0]["location"], "host_id": "hostB"}}
    mixed = desc.replace(producers=(elsewhere, *desc.producers[1:]))
    ids = []
    for sub in range(SUBS):
        gate = gate_of(svc, config, sub, mixed)
        ids += [i for b in gate for i in b.column("id").to_pylist()]
        assert gate.stats()["path"] == "channels"
        assert sorted(c["locality"] for c in gate.stats()["channels"]) == ["local-file"] * 3 + ["remote"]
    assert sorted(ids) == list(range(20_000))


def test_mapped_batches_stay_valid_after_the_gate_closed_and_the_exchange_was_dropped(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", service=svc.unix,
                           **options("mapped", partitionType="BLOCKING", bufferSize="1m"))
    write(config, 2, 300_000)
    desc = ex.describe_exchange(config)
    kept, stats = [], []
    for sub in range(SUBS):
        gate = gate_of(svc, config, sub, desc)
        kept += list(gate)  # read to the end: the gate closed its files
        stats.append(gate.stats())
    assert all(s["path"] == "local files" for s in stats)
    assert sum(s["mapped_bytes"] for s in stats) > 0.9 * sum(s["bytes"] for s in stats)  # large buffers: mapped
    assert min(len(b.column(0).buffers()[1]) for b in kept if b.num_rows > 10_000) >= MAP_MIN // 2
    spill = [Path(p["spill"]) for p in desc.producers]
    ex.drop_exchange("mapped", config)  # the service unlinks the files; the live batches keep their pages
    assert not any(p.exists() for p in spill)
    gc.collect()
    table = pa.Table.from_batches(kept).sort_by("id")
    assert table.column("id").to_pylist() == list(range(600_000))
    assert table.column("s").to_pylist()[::9973] == [str(i) for i in range(0, 600_000, 9973)]


def test_a_flipped_byte_in_a_mapped_buffer_is_corrupt_and_truncation_is_lost_not_sigbus(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", service=svc.unix,
                           **options("mapped-bad", partitionType="BLOCKING", bufferSize="1m"))
    write(config, 1, 300_000)
    desc = ex.describe_exchange(config)
    pid = desc.producers[0]["partition"]
    data = Path(desc.producers[0]["spill"])
    entries = [e for e in read_index(str(data.with_suffix(".index")), 1) if e[3] == BufferKind.DATA]
    _seq, offset, length, _kind, _flags = max(entries, key=lambda e: e[2])
    assert length >= MAP_MIN
    with open(data, "r+b") as f:
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    gate = gate_of(svc, config, 1, desc)
    with pytest.raises(ExchangeReadError, match="corrupt") as err:
        list(gate)
    assert gate.stats()["path"] == "local files"
    assert pid in str(err.value) and "subpartition 1" in str(err.value)

    with open(data, "r+b") as f:  # cut inside that buffer: the index says more than the file holds
        f.truncate(offset + length // 2)
    with pytest.raises(ExchangeReadError, match="corrupt|lost") as err:
        list(gate_of(svc, config, 1, desc))
    assert pid in str(err.value)


def test_a_file_truncated_after_it_was_opened_is_corrupt_not_a_crash(tmp_path):
    path = tmp_path / "x.data"
    path.write_bytes(os.urandom(4 * MAP_MIN))
    (tmp_path / "x.index").write_bytes(INDEX_MAGIC)
    data = open_spill_data(str(path), str(tmp_path / "x.index"))
    assert bytes(data.read(MAP_MIN, MAP_MIN)) == path.read_bytes()[MAP_MIN:2 * MAP_MIN]
    os.truncate(path, MAP_MIN + 100)  # behind the reader's back, after the mapping was made
    with pytest.raises(SpillCorruptError, match="truncated"):
        data.read(2 * MAP_MIN, MAP_MIN)  # checked against the file's size before a page is touched
    assert not data.unchanged()  # the next task's lookup sees it and maps the file as it is now
    again = open_spill_data(str(path), str(tmp_path / "x.index"))
    assert again is not data and again.size == MAP_MIN + 100
    with pytest.raises(SpillCorruptError, match="truncated"):
        again.read(MAP_MIN + 50, 100)


def test_read_tasks_of_one_process_share_mapped_files_within_bounds(tmp_service, monkeypatch):
    """Files read once stay mapped for the process's next reads (one fstat pair each), up to max_files;
    a dropped exchange's files are noticed (their index unlinked) and let go."""
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", service=svc.unix,
                           **options("shared-maps", partitionType="BLOCKING", bufferSize="8k"))
    write(config, 6, 1_000)
    desc = ex.describe_exchange(config)
    list(gate_of(svc, config, 0, desc))  # warm: the IO thread's connection (the report of bytes read) is up
    OPEN_FILES.clear()
    gc.collect()
    fds = open_fds()
    first = pa.Table.from_batches(list(gate_of(svc, config, 0, desc))).to_pydict()  # a copy: no mapped batch kept
    assert len(OPEN_FILES) == 6 and open_fds() == fds + 12  # the mapping's fd and the index's, per file
    for sub in (1, 2, 0):
        list(gate_of(svc, config, sub, desc))
    assert len(OPEN_FILES) == 6 and open_fds() == fds + 12
    assert pa.Table.from_batches(list(gate_of(svc, config, 0, desc))).to_pydict() == first

    monkeypatch.setattr(OPEN_FILES, "max_files", 4)
    assert pa.Table.from_batches(list(gate_of(svc, config, 0, desc))).to_pydict() == first
    gc.collect()
    assert len(OPEN_FILES) == 4 and open_fds() <= fds + 8

    ex.drop_exchange("shared-maps", config)
    with pytest.raises(ExchangeReadError, match="was dropped while this read ran.*cannot read the spill file"):
        list(gate_of(svc, config, 0, desc))  # a read planned before the drop: the files are gone, not stale
    gc.collect()
    # one fd more at most: the IO thread's connection to the coordinator, which told the read what happened
    assert len(OPEN_FILES) == 0 and open_fds() <= fds + 1
    OPEN_FILES.clear()


def test_an_early_stop_and_a_failed_read_close_every_file(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", service=svc.unix,
                           **options("fast-fds", partitionType="BLOCKING", bufferSize="8k"))
    write(config, 8, 2_000)
    desc = ex.describe_exchange(config)
    list(gate_of(svc, config, 0, desc))  # warm: indexes cached, the IO thread and its connection up
    deadline = time.monotonic() + 10  # the report of the bytes read goes out after the read: wait for it
    while svc.status()["traffic"]["local_file"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    before = open_fds()
    for _ in range(3):
        reader = iter(gate_of(svc, config, 0, desc))
        next(reader)
        reader.close()  # the task stops after one batch (a limit)
    assert open_fds() <= before
    data = Path(desc.producers[3]["spill"])
    _seq, offset, length, _kind, _flags = next(e for e in read_index(str(data.with_suffix(".index")), 0)
                                               if e[3] == BufferKind.DATA)
    with open(data, "r+b") as f:  # a checksum fails in the middle of the read (the fourth file)
        f.seek(offset + length // 2)
        f.write(b"\xff\x00\xff")
    with pytest.raises(ExchangeReadError, match="corrupt"):
        list(gate_of(svc, config, 0, desc))
    assert open_fds() <= before  # while the error (and its traceback's frames) is still alive
    last = Path(desc.producers[-1]["spill"])
    last.with_suffix(".index").write_bytes(b"not an index")
    for _ in range(3):
        with pytest.raises(ExchangeReadError, match="corrupt"):
            list(gate_of(svc, config, 0, desc))  # seven files read, the eighth fails to open
    assert open_fds() <= before


def test_small_batches_are_joined_for_spark_and_large_ones_pass_untouched():
    from sparkflow_exchange.consumer.rebatch import rebatched

    small = [batch(i * 100, 100) for i in range(50)]  # ~2.5 KiB each
    large = batch(5_000, 40_000)
    out = list(rebatched(small[:30] + [large] + small[30:], target_bytes=32 << 10))
    assert pa.Table.from_batches(out).equals(pa.Table.from_batches(small[:30] + [large] + small[30:]))
    assert any(b is large for b in out)  # not copied
    assert len(out) <= 5 and out[0].nbytes >= 32 << 10  # 50 small ones: a joined one, the rest before `large`, one after
    assert list(rebatched([], 1 << 20)) == []
    (one,) = rebatched(small[:1], 1 << 20)
    assert one is small[0]
