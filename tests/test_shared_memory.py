"""Writers on the service's host push through shared-memory slots: exact data, recycled slots, no leftovers."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from harness import client_config
from test_bad_input import RawClient, healthy
from test_service import SCHEMA, Worker, join_all, producer_batches, read_all

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import seal
from sparkflow_exchange.buffer_kinds import FLAG_SHARED
from sparkflow_exchange.network.protocol import (
    BufferResponse,
    ErrorResponse,
    PartitionRegistered,
    PartitionRequest,
    ProducerCredit,
    PushSharedBuffer,
    RegisterPartition,
    SharedBuffersRead,
    SharedRef,
    SlotsFreed,
)
from sparkflow_exchange.partition import shared_arena
from sparkflow_exchange.partition.shared_arena import SharedArena, sweep_orphan_arenas

pytestmark = pytest.mark.skipif(not shared_arena.available(), reason="no writable /dev/shm")


def my_arenas() -> list[Path]:
    return list(shared_arena.SHM_DIR.glob(f"{shared_arena.PREFIX}{os.getpid()}-*"))


def wait_for_reader(svc, partition: str, timeout: float = 60.0) -> None:
    """Until a reader's channel is open on ``partition`` at ``svc``."""
    deadline = time.monotonic() + timeout
    with svc.connect(svc.unix) as conn:
        while not any(c["partition"] == partition for c in conn.call("status")["channels"]):
            assert time.monotonic() < deadline, f"no reader of {partition} within {timeout:g} s"
            time.sleep(0.02)


def write_and_read(svc, partition_type: str, *, shared: bool = True, reads: int = 1, rows: int = 200_000):
    """One producer on the service's host, one consumer reading while it writes; returns (writer, tables)."""
    base = dict(exchange=f"shm-{partition_type}-{shared}", partitioner="forward", numSubpartitions=1,
                partitionType=partition_type, bufferSize="64k", buffersPerPartition=4, bufferTimeout="0",
                sharedMemory=str(shared).lower())
    config = client_config(svc, service=svc.unix, hostId=svc.info["host_id"], **base)
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    batches = producer_batches(0, rows, batch_rows=5000)
    tables: list[pa.Table] = []
    state = {}

    def produce() -> None:
        task = ex.ProducerTask(handle, 0, "attempt-0")
        state["writer"] = task.writer
        state["arenas_while_writing"] = my_arenas()
        # the reader reads while this writes: without it, a HYBRID partition's reader that comes late (a
        # loaded machine) finds every buffer on disk already, or the finished file, and nothing is shared
        wait_for_reader(svc, task.partition)
        task.write(batches)
        wh.commit_write(handle, [task.finish()["partition"]])

    def consume() -> None:
        tables.append(read_all(config, ex.describe_exchange(config), 0))

    workers = [Worker(consume), Worker(produce)]
    for w in workers:
        w.start()
    join_all(workers, time.monotonic() + 60)
    for _ in range(reads - 1):
        tables.append(read_all(config, ex.describe_exchange(config), 0))
    expected = pa.Table.from_batches(batches, schema=SCHEMA)
    for table in tables:
        assert table.equals(expected)  # every row once, in order
    return state, tables


@pytest.mark.parametrize("partition_type", ["PIPELINED_BOUNDED", "HYBRID"])
def test_writer_on_the_service_host_recycles_shared_slots(tmp_service, partition_type):
    """About 7 MB through a pool of 4 slots of 64 KiB: every slot is refilled many times while the
    consumer reads, and not one buffer is read after its slot was handed back (the data would differ)."""
    svc = tmp_service()
    state, _ = write_and_read(svc, partition_type, reads=2 if partition_type == "HYBRID" else 1)
    writer = state["writer"]
    assert writer.arena is not None  # the buffers went through shared memory
    assert writer.buffers_pushed > 10 * writer.arena.slots
    # all of them: credit comes only with a free slot, even while the reader still copies one out
    assert writer.buffers_shared == writer.buffers_pushed
    traffic = svc.status()["traffic"]
    assert traffic["local_shared"] > 0  # and the reader copied them out of the slots itself
    service_arenas = list(shared_arena.SHM_DIR.glob(f"{shared_arena.PREFIX}{svc.proc.pid}-*"))
    assert service_arenas == []  # finished and all read: the shared memory is given back before any drop
    assert state["arenas_while_writing"] == []  # unlinked once the service had mapped it
    assert my_arenas() == []


def test_shared_memory_can_be_switched_off(tmp_service):
    svc = tmp_service()
    state, _ = write_and_read(svc, "PIPELINED_BOUNDED", shared=False, rows=20_000)
    assert state["writer"].arena is None
    assert svc.status()["traffic"]["local_shared"] == 0 < svc.status()["traffic"]["local"]


def test_writer_over_tcp_pushes_over_the_socket(tmp_service):
    svc = tmp_service()
    config = client_config(svc, exchange="shm-tcp", partitioner="forward", numSubpartitions=1,
                           partitionType="PIPELINED_BOUNDED", bufferSize="64k", bufferTimeout="0")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "attempt-0")
    assert task.writer.arena is None  # another host as far as the service can tell
    task.write(producer_batches(0, 1000))
    wh.commit_write(handle, [task.finish()["partition"]])
    assert read_all(config, ex.describe_exchange(config), 0).num_rows == 1000
    assert my_arenas() == []


def register_with_arena(client: RawClient, name: str, slots: int = 2, slot_size: int = 4096):
    arena = SharedArena.create(slots, slot_size)
    client.send(RegisterPartition(name, 1, "PIPELINED_BOUNDED", "", "", 1024, slots, str(arena.path), slots, slot_size))
    registered = client.next()
    credit = client.next()
    arena.unlink()
    assert isinstance(registered, PartitionRegistered) and isinstance(credit, ProducerCredit)
    return arena, registered


def ipc_payload(start: int, rows: int) -> bytes:
    """A data buffer as a writer makes it: the batch's IPC message and its checksum trailer."""
    return seal(pa.record_batch([pa.array(range(start, start + rows))], names=["v"]).serialize()).to_pybytes()


def push_into_slots(client: RawClient, arena: SharedArena, registered, payloads: list[bytes]) -> None:
    """Payload i is written into slot i and pushed by reference, as a writer does."""
    for slot, payload in enumerate(payloads):
        arena.slot(slot)[:len(payload)] = payload
        client.send(PushSharedBuffer(registered.handle, 0, 0, 0, slot, 0, len(payload)))


def collect_freed(client: RawClient, want: int, timeout: float) -> list[int]:
    freed: list[int] = []
    deadline = time.monotonic() + timeout
    while len(freed) < want and time.monotonic() < deadline:
        try:
            msg = client.next(max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            break
        if isinstance(msg, SlotsFreed):
            freed.extend(msg.slots)
    return freed


def test_bad_shared_pushes_are_named_and_the_service_goes_on(tmp_service):
    svc = tmp_service()
    client = RawClient(svc, unix=True)
    client.send(RegisterPartition("p-plain", 1, "PIPELINED_BOUNDED", "", "", 1024, 2))
    plain = client.next()
    client.next()
    client.send(PushSharedBuffer(plain.handle, 0, 0, 0, 0, 0, 10))
    assert "has no shared-memory arena" in client.error_then_close().message

    client = RawClient(svc, unix=True)
    arena, registered = register_with_arena(client, "p-range")
    assert registered.shm_slots == 2
    client.send(PushSharedBuffer(registered.handle, 0, 0, 0, 7, 0, 10))
    assert "arena slot 7 is outside 0..1" in client.error_then_close().message

    client = RawClient(svc, unix=True)
    arena, registered = register_with_arena(client, "p-twice")
    client.send(PushSharedBuffer(registered.handle, 0, 0, 0, 1, 0, 10))
    client.send(PushSharedBuffer(registered.handle, 0, 0, 0, 1, 0, 10))  # not freed in between
    assert "arena slot 1 is in use" in client.error_then_close().message

    client = RawClient(svc, unix=True)
    arena, registered = register_with_arena(client, "p-size", slot_size=4096)
    client.send(PushSharedBuffer(registered.handle, 0, 0, 0, 0, 4000, 200))
    assert "do not fit a slot of 4096 bytes" in client.error_then_close().message
    healthy(svc)


def test_slots_come_back_once_read(tmp_service):
    """Once a reader has taken both buffers, the service hands both slots back to the writer."""
    svc = tmp_service()
    client = RawClient(svc, unix=True)
    arena, registered = register_with_arena(client, "p-freed", slots=2, slot_size=64 * 1024)
    payloads = [ipc_payload(0, 100), ipc_payload(100, 100)]
    push_into_slots(client, arena, registered, payloads)
    reader = RawClient(svc)
    reader.send(PartitionRequest("p-freed", 0, 1, 2))
    got = [reader.next(), reader.next()]
    assert [bytes(m.payload) for m in got if isinstance(m, BufferResponse)] == payloads
    assert sorted(collect_freed(client, 2, 10)) == [0, 1]


def test_service_maps_only_arenas_in_dev_shm(tmp_service, tmp_path):
    svc = tmp_service()
    client = RawClient(svc, unix=True)
    outside = tmp_path / f"{shared_arena.PREFIX}{os.getpid()}-abc"
    outside.write_bytes(bytes(8192))
    client.send(RegisterPartition("p-outside", 1, "PIPELINED_BOUNDED", "", "", 1024, 2, str(outside), 2, 4096))
    registered = client.next()
    assert isinstance(registered, PartitionRegistered) and registered.shm_slots == 0  # pushes go over the socket
    assert outside.exists()
    client.send(RegisterPartition("p-missing", 1, "PIPELINED_BOUNDED", "", "", 1024, 2,
                                  str(shared_arena.SHM_DIR / f"{shared_arena.PREFIX}1-feed"), 2, 4096))
    registered = [m for m in (client.next(), client.next()) if isinstance(m, PartitionRegistered)][0]
    assert registered.shm_slots == 0
    assert not any(isinstance(m, ErrorResponse) for m in client.pending)
    healthy(svc)


def test_sweep_removes_arenas_of_dead_writers():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    orphan = shared_arena.SHM_DIR / f"{shared_arena.PREFIX}{dead_pid}-0123456789ab"
    mine = SharedArena.create(1, 4096)
    orphan.write_bytes(b"x")
    try:
        removed = sweep_orphan_arenas()
        assert orphan in removed and not orphan.exists()
        assert mine.path.exists()  # its writer (this process) is alive
    finally:
        orphan.unlink(missing_ok=True)
        mine.unlink()


def test_local_reader_gets_references_and_slots_wait_for_its_copy(tmp_service):
    """A reader on the service's host is sent where each buffer is; its slot goes back to the writer
    only when that reader says it copied it (or disconnects), never merely because it was sent."""
    svc = tmp_service()
    writer = RawClient(svc, unix=True)
    arena, registered = register_with_arena(writer, "p-pinned", slots=2, slot_size=64 * 1024)
    payloads = [ipc_payload(0, 50), ipc_payload(1, 50)]
    push_into_slots(writer, arena, registered, payloads)

    reader = RawClient(svc, unix=True)
    reader.send(PartitionRequest("p-pinned", 0, 5, 2, 0, True))
    refs = [reader.next(), reader.next()]
    assert all(isinstance(m, BufferResponse) and m.flags & FLAG_SHARED for m in refs)
    for ref, payload in zip(refs, payloads):
        where = SharedRef.unpack(ref.payload)
        with open(where.path, "rb") as f:  # what a reader copies out: exactly the pushed bytes
            f.seek(where.offset)
            assert f.read(where.length) == payload
    assert collect_freed(writer, 1, 0.5) == []  # sent, but not copied yet: the slots stay pinned

    reader.send(SharedBuffersRead(5, 1))
    assert collect_freed(writer, 1, 5) == [0]
    reader.sock.close()  # the other one is never copied: the reader is gone, its pin with it
    assert collect_freed(writer, 1, 5) == [1]

    bad = RawClient(svc, unix=True)
    bad.send(SharedBuffersRead(99, 1))
    assert "SharedBuffersRead(1) for receiver 99, which holds 0 shared buffers" in bad.error_then_close().message
    healthy(svc)


def test_remote_readers_get_bytes_not_references(tmp_service):
    svc = tmp_service()
    writer = RawClient(svc, unix=True)
    arena, registered = register_with_arena(writer, "p-remote", slots=1, slot_size=64 * 1024)
    payload = ipc_payload(0, 10)
    push_into_slots(writer, arena, registered, [payload])
    reader = RawClient(svc)  # TCP: whatever it asks for, it cannot map this host's memory
    reader.send(PartitionRequest("p-remote", 0, 6, 2, 0, True))
    msg = reader.next()
    assert isinstance(msg, BufferResponse) and not msg.flags & FLAG_SHARED and bytes(msg.payload) == payload


def _shmem_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_finished_partitions_do_not_keep_their_writers_arenas_mapped(tmp_service):
    """A finished HYBRID partition stays alive until dropped, but its writer's arena (buffersPerPartition
    slots of shared memory) must be unmapped once its connection is gone: 40 of them must not add up."""
    svc = tmp_service()
    config = client_config(svc, service=svc.unix, hostId=svc.info["host_id"], exchange="shm-many",
                           partitioner="hash", keys="key", numSubpartitions=8, bufferSize="256k",
                           buffersPerPartition=8)  # an arena of about 2.5 MiB per writer
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    partitions = []
    for index in range(40):
        task = ex.ProducerTask(handle, index, f"attempt-{index}")
        assert task.writer.arena is not None
        task.write(producer_batches(index, 20_000, batch_rows=5000))
        partitions.append(task.finish()["partition"])
    wh.commit_write(handle, partitions)
    deadline = time.monotonic() + 10
    while _shmem_mib(svc.proc.pid) > 8 and time.monotonic() < deadline:  # the last connection closes meanwhile
        time.sleep(0.1)
    assert _shmem_mib(svc.proc.pid) <= 8, f"{_shmem_mib(svc.proc.pid):.0f} MiB of arenas still mapped (40 x 2.5 MiB written)"
    rows = sum(read_all(config, ex.describe_exchange(config), s).num_rows for s in range(8))
    assert rows == 40 * 20_000
