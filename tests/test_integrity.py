"""End-to-end integrity against a real service: corruption and loss are errors that say so, never wrong rows.

Every data buffer carries a CRC32C trailer checked by the reader on every path (spill file read locally,
spill file served over TCP, shared-memory slot); every end-of-partition carries its subpartition's buffer
and row counts; a write's commit checks each producer's rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.buffer import BatchEncoder, ChecksumError, decode, seal
from sparkflow_exchange.buffer_kinds import BufferKind
from sparkflow_exchange.errors import ExchangeError, ExchangeReadError
from sparkflow_exchange.partition.spill import INDEX_MAGIC, _index_dtype, read_index

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
ROWS = 30_000
SUBS = 3


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = pa.array(np.arange(start, start + rows, dtype=np.int64))
    return pa.record_batch([ids, pa.compute.cast(ids, pa.string())], schema=SCHEMA)


def write(config, rows: int = ROWS) -> tuple[wh.WriteHandle, str]:
    """One producer, committed; returns the handle and its partition id."""
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([batch(0, rows)])
    result = producer.finish()
    wh.commit_write(handle, [result["partition"]], {result["partition"]: result["rows"]})
    return handle, result["partition"]


def read_ids(config, sub: int) -> list[int]:
    desc = ex.describe_exchange(config)
    return [i for b in ex.read_subpartition(config, desc, sub) for i in b.column("id").to_pylist()]


def spill_paths(config) -> tuple[Path, Path]:
    desc = ex.describe_exchange(config)
    data = Path(desc.producers[0]["spill"])
    return data, data.with_suffix(".index")


def first_data_entry(index: Path, sub: int) -> tuple[int, int, int, int, int]:
    return next(e for e in read_index(index, sub) if e[3] == BufferKind.DATA)


# ---------------------------------------------------------------- the buffer itself
@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_every_encoded_buffer_is_sealed_and_any_flip_is_caught(compression):
    enc = BatchEncoder(SCHEMA, compression)
    for rows in (10, 50_000):  # a small one (copied with its trailer) and a large one (serialised in place)
        payload = enc.encode(batch(0, rows)).to_pybytes()
        assert decode(payload, SCHEMA).equals(batch(0, rows))
        for at in (0, len(payload) // 2, len(payload) - 1):  # the message, its body, the trailer
            bad = bytearray(payload)
            bad[at] ^= 0x40
            with pytest.raises(ChecksumError):
                decode(bytes(bad), SCHEMA)
        with pytest.raises(ChecksumError):
            decode(payload[:-16] + payload[-8:], SCHEMA)  # cut short: the length in the trailer says so
    slot = bytearray(1 << 20)
    offset, length = enc.encode_into(batch(5, 1000), memoryview(slot))
    assert decode(memoryview(slot)[offset:offset + length], SCHEMA).equals(batch(5, 1000))
    assert seal(batch(5, 1000).serialize()).to_pybytes() == BatchEncoder(SCHEMA).encode(batch(5, 1000)).to_pybytes()


# ---------------------------------------------------------------- spill files
@pytest.mark.parametrize("reader_host", ["hostA", "hostB"])  # the local file channel; a remote reader over TCP
def test_flipped_bytes_in_a_blocking_spill_file_are_corrupt(tmp_service, reader_host):
    svc = tmp_service(host_id="hostA")
    base = dict(exchange=f"flip-{reader_host}", partitioner="hash", keys="id", numSubpartitions=SUBS,
                bufferSize="8k", partitionType="BLOCKING")
    _, pid = write(client_config(svc, hostId="hostA", **base))
    config = client_config(svc, hostId=reader_host, **base)
    intact = read_ids(config, 1)
    data, index = spill_paths(config)
    _seq, offset, length, _kind, _flags = first_data_entry(index, 1)
    with open(data, "r+b") as f:  # three bytes in the middle of subpartition 1's first buffer
        f.seek(offset + length // 2)
        raw = bytearray(f.read(3))
        f.seek(offset + length // 2)
        f.write(bytes(b ^ 0xFF for b in raw))
    with pytest.raises(ExchangeReadError, match="corrupt") as err:
        read_ids(config, 1)
    message = str(err.value)
    assert pid in message and "subpartition 1" in message and "flip-" in message, message
    assert read_ids(config, 0) + read_ids(config, 2) + intact  # the other subpartitions still read
    assert sorted(read_ids(config, 0) + intact + read_ids(config, 2)) == list(range(ROWS))


def test_a_buffer_missing_from_the_index_is_lost(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="lost-entry", partitioner="hash", keys="id",
                           numSubpartitions=SUBS, bufferSize="8k", partitionType="BLOCKING")
    _, pid = write(config)
    assert len(read_ids(config, 2)) > 0
    _, index = spill_paths(config)
    raw = index.read_bytes()
    entries = np.frombuffer(raw[len(INDEX_MAGIC):], dtype=_index_dtype())
    drop = np.flatnonzero((entries["sub"] == 2) & (entries["kind"] == BufferKind.DATA))[1]
    index.write_bytes(INDEX_MAGIC + np.delete(entries, drop).tobytes())
    with pytest.raises(ExchangeReadError, match="lost") as err:  # the index's own check sees the gap
        read_ids(config, 2)
    assert pid in str(err.value) and "subpartition 2" in str(err.value)


def test_a_truncated_spill_file_is_lost_not_short(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="truncated", partitioner="hash", keys="id",
                           numSubpartitions=SUBS, bufferSize="8k", partitionType="BLOCKING")
    _, pid = write(config)
    data, index = spill_paths(config)
    last = max(e[1] + e[2] for e in read_index(index, 0) if e[3] == BufferKind.DATA)
    with open(data, "r+b") as f:
        f.truncate(last - 100)
    with pytest.raises(ExchangeReadError, match="lost|corrupt") as err:
        read_ids(config, 0)
    assert pid in str(err.value)


# ---------------------------------------------------------------- shared memory
def test_flipped_bytes_in_a_shared_memory_slot_are_corrupt(tmp_service):
    svc = tmp_service()
    config = client_config(svc, service=svc.unix, hostId=svc.info["host_id"], exchange="shm-flip",
                           partitioner="forward", numSubpartitions=1, partitionType="PIPELINED_BOUNDED",
                           bufferSize="64k", buffersPerPartition=8, bufferTimeout="0", sharedMemory="true")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([batch(0, 2000)])  # a few buffers, all in slots: nobody reads yet
    writer = producer.writer
    arena = writer.arena
    result = producer.finish()
    assert writer.buffers_shared == writer.buffers_pushed > 0
    slot = arena.slot(0)
    for at in (300, 301, 302):  # after the push, before the local reader copies the slot out
        slot[at] ^= 0xFF
    wh.commit_write(handle, [result["partition"]], {result["partition"]: result["rows"]})
    with pytest.raises(ExchangeReadError, match="corrupt") as err:
        read_ids(config, 0)
    assert result["partition"] in str(err.value) and "subpartition 0" in str(err.value)


# ---------------------------------------------------------------- counts
def test_a_buffer_the_service_never_stored_fails_the_partition_as_lost(tmp_service):
    svc = tmp_service()
    config = client_config(svc, exchange="lost-push", partitioner="hash", keys="id", numSubpartitions=SUBS,
                           bufferSize="8k", partitionType="HYBRID")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([batch(0, 5000)])
    producer.records.flush()
    producer.records.sent_buffers[1] += 1  # the writer counted a push that never reached the service
    with pytest.raises(ExchangeError, match="lost") as err:  # user-facing: Spark prints it without a traceback
        producer.finish()
    assert "subpartition 1" in str(err.value) and producer.partition in str(err.value)
    part = next(p for p in svc.status()["partitions"] if p["partition"] == producer.partition)
    assert part["state"] == "failed"


def test_commit_with_a_wrong_row_count_is_refused_as_lost(tmp_service):
    svc = tmp_service()
    config = client_config(svc, exchange="rows", partitioner="hash", keys="id", numSubpartitions=SUBS,
                           bufferSize="8k", partitionType="HYBRID")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([batch(0, 4000)])
    result = producer.finish()
    assert result["rows"] == 4000
    with pytest.raises(ExchangeError, match="lost") as err:
        wh.commit_write(handle, [result["partition"]], {result["partition"]: 3999})
    assert "4000" in str(err.value) and result["partition"] in str(err.value)
    assert not ex.describe_exchange(config, wait=False).sealed
    wh.commit_write(handle, [result["partition"]], {result["partition"]: 4000})
    desc = ex.describe_exchange(config)
    assert desc.sealed and desc.rows == 4000
    assert sorted(i for s in range(SUBS) for i in read_ids(config, s)) == list(range(4000))


class MeddlingProxy:
    """A TCP proxy between a reader and the service that changes the service's first data buffer on the wire:
    ``flip`` one byte of its payload, or ``drop`` it. Everything else passes as it came."""

    def __init__(self, upstream: str, how: str) -> None:
        import socket
        import threading

        self.upstream = upstream
        self.how = how
        self.meddled = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        import socket
        import threading

        self.server.settimeout(30)
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            host, port = self.upstream.rsplit(":", 1)
            service = socket.create_connection((host, int(port)), timeout=30)
            for target, args in ((self._raw, (client, service)), (self._frames, (service, client))):
                threading.Thread(target=target, args=args, daemon=True).start()

    @staticmethod
    def _raw(src, dst) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def _frames(self, src, dst) -> None:
        from dataclasses import replace

        from sparkflow_exchange.network.protocol import BufferResponse, FrameDecoder, encode_bytes

        decoder = FrameDecoder()
        try:
            while data := src.recv(1 << 16):
                out = []
                for msg in decoder.feed(data):
                    if isinstance(msg, BufferResponse) and msg.kind == BufferKind.DATA and not self.meddled:
                        self.meddled += 1
                        if self.how == "drop":
                            continue
                        payload = bytearray(msg.payload)
                        payload[len(payload) // 2] ^= 0x5A
                        msg = replace(msg, payload=bytes(payload))
                    out.append(encode_bytes(msg))
                dst.sendall(b"".join(out))
        except OSError:
            pass
        finally:
            dst.close()

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("how, word", [("flip", "corrupt"), ("drop", "lost")])
def test_a_buffer_changed_or_dropped_on_the_wire_is_corrupt_or_lost(tmp_service, how, word):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange=f"wire-{how}", partitioner="hash", keys="id",
                           numSubpartitions=SUBS, bufferSize="8k", partitionType="HYBRID")
    _, pid = write(config)
    reader = client_config(svc, hostId="elsewhere", exchange=f"wire-{how}", readerTimeout="30")
    desc = ex.describe_exchange(reader)
    proxy = MeddlingProxy(svc.tcp, how)
    try:
        for producer in desc.producers:
            producer["location"] = {**producer["location"], "tcp": proxy.address}
        with pytest.raises(ExchangeReadError, match=word) as err:
            for sub in range(SUBS):
                list(ex.read_subpartition(reader, desc, sub))
        assert proxy.meddled == 1 and pid in str(err.value)
    finally:
        proxy.close()
    assert sorted(i for s in range(SUBS) for i in read_ids(reader, s)) == list(range(ROWS))  # the service is fine
