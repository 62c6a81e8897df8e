"""Region pushes (FLIP-148): several subpartitions' buffers in one frame, one credit and one pool slot.

A real service process: regions pushed over TCP, the Unix socket and a shared-memory arena are read
back exactly by a remote reader, a local shared-memory reader and (finished) straight from the spill
file; the slot comes back only when every piece's memory was dropped; bad regions are named.
"""
from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from test_bad_input import RawClient, healthy

from sparkflow_exchange.buffer import decode, seal
from sparkflow_exchange.buffer_kinds import FLAG_SHARED, BufferKind
from sparkflow_exchange.network.protocol import (
    BufferResponse,
    ErrorResponse,
    FinishPartition,
    PartitionFinished,
    PartitionRegistered,
    PartitionRequest,
    ProducerCredit,
    PushRegion,
    PushSharedRegion,
    RegisterPartition,
    SharedBuffersRead,
    SharedRef,
    SlotsFreed,
)
from sparkflow_exchange.partition import shared_arena
from sparkflow_exchange.partition.shared_arena import SharedArena
from sparkflow_exchange.partition.spill import read_index

SCHEMA = pa.schema([pa.field("v", pa.int64())])
N = 4  # subpartitions
EOP = BufferKind.END_OF_PARTITION


def make_region(spec: list[tuple[int, int, int]]) -> tuple[bytes, tuple, list[tuple[int, bytes]]]:
    """A region (schema, then one sealed data buffer per piece) and its pieces: spec is (subpartition, start, rows)."""
    parts = [SCHEMA.serialize().to_pybytes()]
    pieces, expected = [], []
    offset = len(parts[0])
    for sub, start, rows in spec:
        msg = seal(pa.record_batch([pa.array(range(start, start + rows), pa.int64())], schema=SCHEMA).serialize()
                   ).to_pybytes()
        pieces.append((sub, offset, len(msg)))
        expected.append((sub, msg))
        parts.append(msg)
        offset += len(msg)
    return b"".join(parts), tuple(pieces), expected


def regions(count: int) -> list[tuple[bytes, tuple, list[tuple[int, bytes]]]]:
    """``count`` regions; each holds pieces of three of the four subpartitions (two of one of them)."""
    out = []
    for r in range(count):
        subs = [(r + k) % N for k in range(3)] + [r % N]
        out.append(make_region([(sub, 1000 * r + 100 * k, 10 + k) for k, sub in enumerate(subs)]))
    return out


def expected_by_sub(regs) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {s: [] for s in range(N)}
    for _payload, _pieces, expected in regs:
        for sub, msg in expected:
            out[sub].append(msg)
    return out


class Writer:
    """A raw producer: registers, counts credit, collects SlotsFreed."""

    def __init__(self, svc, name: str, ptype: str, unix: bool, arena: SharedArena | None = None,
                 slots: int = 4, slot_size: int = 64 * 1024) -> None:
        self.client = RawClient(svc, unix=unix)
        self.credit = 0
        self.freed: list[int] = []
        self.errors: list[ErrorResponse] = []
        self.client.send(RegisterPartition(name, N, ptype, "", "", slot_size, slots,
                                           str(arena.path) if arena else "", arena.slots if arena else 0,
                                           arena.slot_size if arena else 0))
        msg = self.client.next()
        assert isinstance(msg, PartitionRegistered), msg
        self.registered = msg
        self.handle = msg.handle
        self.drain(0.3)

    def on(self, msg) -> None:
        if isinstance(msg, ProducerCredit):
            self.credit += msg.credit
        elif isinstance(msg, SlotsFreed):
            self.freed.extend(msg.slots)
        elif isinstance(msg, ErrorResponse):
            self.errors.append(msg)
        else:
            raise AssertionError(msg)

    def drain(self, timeout: float) -> None:
        try:
            while True:
                self.on(self.client.next(timeout))
        except TimeoutError:
            pass

    def push(self, msg) -> None:
        while self.credit <= 0:
            self.on(self.client.next())
        self.credit -= 1
        self.client.send(msg)

    def finish(self) -> dict:
        self.client.send(FinishPartition(self.handle))
        while True:
            msg = self.client.next()
            if isinstance(msg, PartitionFinished):
                return msg.stats
            self.on(msg)


def read_remote(svc, pid: str, sub: int) -> list[bytes]:
    """A reader over TCP: every data buffer of the subpartition, up to its end."""
    reader = RawClient(svc)
    reader.send(PartitionRequest(pid, sub, 1, 1000))
    out = []
    while True:
        msg = reader.next()
        assert isinstance(msg, BufferResponse), msg
        if msg.kind == EOP:
            return out
        out.append(bytes(msg.payload))


def read_shared(svc, pid: str, sub: int, count: int, acknowledge: bool = True) -> tuple[list[bytes], RawClient]:
    """A reader on the service's host: ``count`` buffers sent by reference, copied out of the arena."""
    reader = RawClient(svc, unix=True)
    reader.send(PartitionRequest(pid, sub, 1, 1000, shared=True))
    out = []
    while len(out) < count:
        msg = reader.next()
        assert isinstance(msg, BufferResponse) and msg.kind == BufferKind.DATA, msg
        assert msg.flags & FLAG_SHARED
        ref = SharedRef.unpack(msg.payload)
        fd = os.open(ref.path, os.O_RDONLY)
        try:
            out.append(os.pread(fd, ref.length, ref.offset))
        finally:
            os.close(fd)
    if acknowledge:
        reader.send(SharedBuffersRead(1, count))
    return out, reader


def read_spill_file(stats: dict, sub: int) -> list[bytes]:
    """The local file channel's way: the index, then pread of the data file."""
    data = Path(stats["spill_path"])
    entries = read_index(data.with_suffix(".index"), sub)
    payload = data.read_bytes()
    assert entries[-1][3] == EOP
    return [payload[off:off + length] for _seq, off, length, kind, _flags in entries if kind == BufferKind.DATA]


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
@pytest.mark.parametrize("ptype", ["PIPELINED_BOUNDED", "HYBRID", "BLOCKING"])
def test_regions_over_the_socket_read_back_exactly(tmp_service, ptype, unix):
    svc = tmp_service()
    pid = f"reg-{ptype}-{unix}"
    writer = Writer(svc, pid, ptype, unix)
    regs = regions(3)  # fits the pool of 4: a bounded partition needs no reader while it is written
    for payload, pieces, _ in regs:
        writer.push(PushRegion(writer.handle, BufferKind.DATA, 0, pieces, payload))
    stats = writer.finish()
    assert writer.errors == []
    assert stats["buffers"] == sum(len(p) for _, p, _ in regs)  # every piece is one buffer
    expected = expected_by_sub(regs)
    for sub in range(N):
        got = read_remote(svc, pid, sub)
        assert got == expected[sub], sub
        assert [decode(g, SCHEMA).num_rows for g in got] == [decode(e, SCHEMA).num_rows
                                                              for e in expected[sub]]
        if ptype != "PIPELINED_BOUNDED":
            assert read_spill_file(stats, sub) == expected[sub]  # the local file channel sees ordinary buffers
            assert read_remote(svc, pid, sub) == expected[sub]  # and it is re-readable
    status = svc.status()
    assert status["memory"]["used"] == 0  # everything read (bounded) or on disk (finished spilling types)
    healthy(svc)


@pytest.mark.skipif(not shared_arena.available(), reason="no writable /dev/shm")
@pytest.mark.parametrize("ptype", ["PIPELINED_BOUNDED", "HYBRID"])
def test_shared_region_slot_comes_back_after_every_piece(tmp_service, ptype):
    """One region in slot 1 with pieces for subpartitions 0, 1, 2: its slot is named in SlotsFreed only
    after all three were streamed and the local readers copied them out."""
    svc = tmp_service()
    pid = f"shreg-{ptype}"
    arena = SharedArena.create(4, 64 * 1024)
    writer = Writer(svc, pid, ptype, unix=True, arena=arena)
    arena.unlink()
    assert writer.registered.shm_slots == 4
    payload, pieces, expected = make_region([(0, 0, 5), (1, 100, 7), (2, 200, 9), (1, 300, 3)])
    arena.slot(1)[:len(payload)] = payload
    writer.push(PushSharedRegion(writer.handle, BufferKind.DATA, 0, 1, pieces))
    got0, _ = read_shared(svc, pid, 0, 1)
    got1, _ = read_shared(svc, pid, 1, 2)
    assert got0 == [expected[0][1]] and got1 == [expected[1][1], expected[3][1]]
    writer.drain(0.5)
    assert writer.freed == []  # subpartition 2's piece is still in the slot
    got2, reader2 = read_shared(svc, pid, 2, 1, acknowledge=False)
    assert got2 == [expected[2][1]]
    writer.drain(0.5)
    assert writer.freed == []  # streamed, but the reader has not said it copied it out
    reader2.send(SharedBuffersRead(1, 1))
    writer.drain(1.0)
    assert writer.freed == [1]
    assert writer.errors == []
    stats = writer.finish()
    if ptype == "HYBRID":
        for sub in range(3):
            assert read_spill_file(stats, sub) == [m for s, m in expected if s == sub]
            assert read_remote(svc, pid, sub) == [m for s, m in expected if s == sub]


@pytest.mark.skipif(not shared_arena.available(), reason="no writable /dev/shm")
def test_many_shared_regions_recycle_slots_while_read(tmp_service):
    """Twenty regions through an arena of 2 slots, a bounded partition read while written: every byte
    read equals what was written, so no slot was refilled while a piece in it was still needed."""
    svc = tmp_service()
    pid = "shreg-many"
    arena = SharedArena.create(2, 64 * 1024)
    writer = Writer(svc, pid, "PIPELINED_BOUNDED", unix=True, arena=arena, slots=2)
    arena.unlink()
    regs = [make_region([(0, 1000 * r, 20), (1, 1000 * r + 500, 30)]) for r in range(20)]
    readers = [RawClient(svc) for _ in range(2)]
    for sub, reader in enumerate(readers):
        reader.send(PartitionRequest(pid, sub, 1, 1000))
    free = [0, 1]
    got: dict[int, list[bytes]] = {0: [], 1: []}
    for payload, pieces, _ in regs:
        while not free or writer.credit <= 0:
            writer.on(writer.client.next())
            free.extend(writer.freed)
            writer.freed.clear()
            for sub, reader in enumerate(readers):  # take what has arrived, so slots come back
                while reader.pending or _readable(reader):
                    got[sub].append(bytes(reader.next().payload))
        slot = free.pop(0)
        arena.slot(slot)[:len(payload)] = payload
        writer.push(PushSharedRegion(writer.handle, BufferKind.DATA, 0, slot, pieces))
    writer.finish()
    for sub, reader in enumerate(readers):
        while True:
            msg = reader.next()
            if msg.kind == EOP:
                break
            got[sub].append(bytes(msg.payload))
    for sub in (0, 1):
        assert got[sub] == [expected[sub][1] for _, _, expected in regs]
    assert writer.errors == []


def _readable(client: RawClient) -> bool:
    client.sock.setblocking(False)
    try:
        data = client.sock.recv(65536)
    except BlockingIOError:
        return False
    finally:
        client.sock.setblocking(True)
    if not data:
        return False
    client.pending.extend(client.decoder.feed(data))
    return bool(client.pending)


def test_bad_regions_are_named_and_the_service_goes_on(tmp_service):
    svc = tmp_service()
    payload, pieces, _ = make_region([(0, 0, 5), (1, 5, 5)])
    # a subpartition out of range: refused, nothing stored, the writer may go on
    writer = Writer(svc, "bad-sub", "HYBRID", unix=False)
    bad = ((7, pieces[0][1], pieces[0][2]),)
    writer.push(PushRegion(writer.handle, BufferKind.DATA, 0, bad, payload))
    writer.push(PushRegion(writer.handle, BufferKind.DATA, 0, pieces, payload))
    stats = writer.finish()
    assert len(writer.errors) == 1 and "subpartition index 7 is out of range 0..3" in writer.errors[0].message
    assert not writer.errors[0].fatal and stats["buffers"] == 2
    # no credit
    writer = Writer(svc, "bad-credit", "PIPELINED_BOUNDED", unix=False, slots=1)
    assert writer.credit == 1
    for _ in range(2):
        writer.client.send(PushRegion(writer.handle, BufferKind.DATA, 0, pieces, payload))
    assert "PushRegion without credit" in writer.client.error_then_close().message
    # not data
    writer = Writer(svc, "bad-kind", "HYBRID", unix=False)
    writer.push(PushRegion(writer.handle, BufferKind.MARKER, 0, pieces, payload))
    assert "kind 2 is not data" in writer.client.error_then_close().message
    # a piece outside the payload
    writer = Writer(svc, "bad-piece", "HYBRID", unix=False)
    writer.push(PushRegion(writer.handle, BufferKind.DATA, 0, ((0, 10, len(payload)),), payload))
    assert "lies outside the region's" in writer.client.error_then_close().message
    healthy(svc)


@pytest.mark.skipif(not shared_arena.available(), reason="no writable /dev/shm")
@pytest.mark.parametrize("case, message", [
    ("slot-range", "arena slot 5 is outside 0..1"),
    ("slot-in-use", "arena slot 0 is in use"),
    ("piece-outside", "outside the slot of 4096 bytes"),
    ("kind", "is not data"),
])
def test_bad_shared_regions_are_named(tmp_service, case, message):
    svc = tmp_service()
    arena = SharedArena.create(2, 4096)
    writer = Writer(svc, f"bad-{case}", "HYBRID", unix=True, arena=arena, slots=2, slot_size=4096)
    arena.unlink()
    pieces = ((0, 0, 100),)
    if case == "slot-range":
        writer.push(PushSharedRegion(writer.handle, BufferKind.DATA, 0, 5, pieces))
    elif case == "slot-in-use":
        writer.push(PushSharedRegion(writer.handle, BufferKind.DATA, 0, 0, pieces))
        writer.push(PushSharedRegion(writer.handle, BufferKind.DATA, 0, 0, pieces))
    elif case == "piece-outside":
        writer.push(PushSharedRegion(writer.handle, BufferKind.DATA, 0, 0, ((0, 4000, 200),)))
    else:
        writer.push(PushSharedRegion(writer.handle, BufferKind.MARKER, 0, 0, pieces))
    assert message in writer.client.error_then_close().message
    healthy(svc)


def test_socket_region_credit_comes_back_after_every_piece(tmp_service):
    """A bounded pool of one slot: the region's credit returns only once both subpartitions took their piece."""
    svc = tmp_service()
    writer = Writer(svc, "reg-credit", "PIPELINED_BOUNDED", unix=False, slots=1)
    assert writer.credit == 1
    payload, pieces, expected = make_region([(0, 0, 5), (3, 50, 5)])
    writer.push(PushRegion(writer.handle, BufferKind.DATA, 0, pieces, payload))
    reader = RawClient(svc)
    reader.send(PartitionRequest("reg-credit", 0, 1, 5))
    assert bytes(reader.next().payload) == expected[0][1]
    writer.drain(0.5)
    assert writer.credit == 0  # subpartition 3's piece still holds the slot
    reader.send(PartitionRequest("reg-credit", 3, 2, 5))
    assert bytes(reader.next().payload) == expected[1][1]
    writer.drain(1.0)
    assert writer.credit == 1 and writer.errors == []
