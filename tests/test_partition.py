"""Result partitions: the three types, broadcast, failure, release, spill files."""
from __future__ import annotations

import os

import pytest

from sparkflow_exchange.buffer_kinds import BROADCAST, END_COUNTS, BufferKind
from sparkflow_exchange.partition.buffer_pool import MemoryBudget
from sparkflow_exchange.partition.result_partition import PartitionStateError, ResultPartition
from sparkflow_exchange.partition.spill import read_index
from sparkflow_exchange.partition.subpartition import ERROR_KIND, ConsumeOnceError

DATA = BufferKind.DATA
EOP = BufferKind.END_OF_PARTITION


def end_of(items, rows: int = -1) -> tuple:
    """The end-of-partition item after ``items`` (kind, payload): it carries the data buffers and rows."""
    return (EOP, END_COUNTS.pack(sum(1 for k, _ in items if k == DATA), rows))
MARKER = BufferKind.MARKER
BUF = 1024


def make(tmp_path, ptype, n=1, slots=4, budget=1 << 20, pid="p0"):
    return ResultPartition(pid, n, ptype, MemoryBudget(budget), slots, BUF, tmp_path)


def payload(i: int, sub: int = 0) -> bytes:
    return f"sub{sub}-buf{i}-".encode() * (1 + i % 7)


def read_all(view):
    """Take everything readable now: [(kind, payload, seq, backlog)]."""
    out = []
    while view.next_is_event() is not None:
        item, seq, backlog = view.take()
        out.append((item.kind, bytes(item.payload), seq, backlog))
        if item.kind in (EOP, ERROR_KIND):
            break
    return out


class Listener:
    def __init__(self):
        self.calls = 0
        self.args = []

    def __call__(self, *args):
        self.calls += 1
        self.args.extend(args)


# ------------------------------------------------------------------ PIPELINED_BOUNDED
def test_pipelined_free_slots_is_writer_credit(tmp_path):
    part = make(tmp_path, "PIPELINED_BOUNDED", slots=4)
    freed = Listener()
    part.on_slots_freed = freed
    assert part.free_slots == 4
    for i in range(4):
        part.add(0, DATA, 0, payload(i))
        assert part.free_slots == 3 - i
    assert part.free_slots == 0
    # events need no slot
    part.add(0, MARKER, 0, b"m")
    assert part.free_slots == 0
    view = part.create_view(0, 0, Listener())
    item, seq, backlog = view.take()
    assert (item.kind, bytes(item.payload), seq, backlog) == (DATA, payload(0), 0, 3)
    assert part.free_slots == 1 and freed.calls == 1
    rest = read_all(view)
    assert [r[2] for r in rest] == [1, 2, 3, 4]
    assert [r[3] for r in rest] == [2, 1, 0, 0]
    assert rest[-1][:2] == (MARKER, b"m")
    assert part.free_slots == 4 and freed.calls == 4
    assert freed.args == [-1, -1, -1, -1]  # socket-pushed buffers occupy no arena slot
    assert part.spill is None  # memory only
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("ptype", ["PIPELINED_BOUNDED", "HYBRID"])
def test_arena_slot_is_freed_with_its_buffer_and_never_read_again(tmp_path, ptype):
    """A buffer in a writer's shared slot: when its memory is dropped, the slot is named and the
    partition stops referring to it (HYBRID reads the spill file from then on)."""
    part = make(tmp_path, ptype, slots=2)
    freed = Listener()
    part.on_slots_freed = freed
    slot_memory = [bytearray(payload(i)) for i in range(3)]
    for i in range(2):
        part.add(0, DATA, 0, memoryview(slot_memory[i]), arena_slot=i)
    view = part.create_view(0, 0, Listener())
    if ptype == "HYBRID":
        assert freed.args == [0]  # the full pool evicted the oldest (it is on disk)
        slot_memory[0][:] = b"X" * len(slot_memory[0])  # the writer reuses slot 0 at once
    item, _, _ = view.take()
    assert bytes(item.payload) == payload(0)
    assert freed.args == [0]
    item, _, _ = view.take()
    assert bytes(item.payload) == payload(1)
    assert freed.args == [0, 1]
    if ptype == "HYBRID":
        part.finish()
        again = part.create_view(0, 0, Listener())
        assert [bytes(again.take()[0].payload) for _ in range(2)] == [payload(0), payload(1)]


def test_pipelined_listener_told_of_new_data(tmp_path):
    part = make(tmp_path, "PIPELINED_BOUNDED")
    listener = Listener()
    view = part.create_view(0, 0, listener)
    assert view.next_is_event() is None
    part.add(0, DATA, 0, b"x")
    assert listener.calls >= 1
    assert view.next_is_event() is False
    part.finish()
    assert [(k, p) for k, p, _, _ in read_all(view)] == [(DATA, b"x"), end_of([(DATA, b"x")])]


def test_pipelined_is_consumed_once(tmp_path):
    part = make(tmp_path, "PIPELINED_BOUNDED", slots=8)
    for i in range(5):
        part.add(0, DATA, 0, payload(i))
    view = part.create_view(0, 0, Listener())
    view.take()
    view.take()
    with pytest.raises(ConsumeOnceError, match="re-reading is impossible"):
        part.create_view(0, 0, Listener())
    view.release()
    with pytest.raises(ConsumeOnceError, match="re-reading is impossible"):
        part.create_view(0, 0, Listener())
    # a consumer that reconnects after what it has already got may resume
    resumed = part.create_view(0, 2, Listener())
    assert [(p, s) for _, p, s, _ in read_all(resumed)] == [(payload(i), i) for i in range(2, 5)]


def test_pipelined_broadcast_slot_freed_after_every_target(tmp_path):
    part = make(tmp_path, "PIPELINED_BOUNDED", n=3, slots=2)
    part.add(BROADCAST, DATA, 0, b"everyone")
    assert part.free_slots == 1  # one slot for three targets
    views = [part.create_view(i, 0, Listener()) for i in range(3)]
    for i, v in enumerate(views):
        item, seq, _ = v.take()
        assert (bytes(item.payload), seq) == (b"everyone", 0)
        assert part.free_slots == (2 if i == 2 else 1)


# ------------------------------------------------------------------ BLOCKING
def _fill_blocking(tmp_path, n=2, count=10):
    part = make(tmp_path, "BLOCKING", n=n)
    expected = {s: [] for s in range(n)}
    for i in range(count):
        for s in range(n):
            if i % 4 == 3:
                part.add(s, MARKER, 0, b"mark%d" % i)
                expected[s].append((MARKER, b"mark%d" % i))
            else:
                part.add(s, DATA, i % 2, payload(i, s))
                expected[s].append((DATA, payload(i, s)))
    return part, expected


def test_blocking_not_readable_before_finish(tmp_path):
    part, expected = _fill_blocking(tmp_path)
    assert part.free_slots > 0  # the writer is never blocked: it writes to disk
    listener = Listener()
    view = part.create_view(0, 0, listener)
    assert view.next_is_event() is None
    assert view.backlog() == 0
    before = listener.calls
    part.finish()
    assert listener.calls > before, "finishing a blocking partition must wake its views"
    got = read_all(view)
    assert [(k, p) for k, p, _, _ in got] == expected[0] + [end_of(expected[0])]
    assert [s for _, _, s, _ in got] == list(range(len(expected[0]) + 1))
    data_left = [sum(1 for k, _ in expected[0][i + 1 :] if k == DATA) for i in range(len(expected[0]))]
    assert [b for _, _, _, b in got[:-1]] == data_left


def test_blocking_rereadable_from_start_and_middle(tmp_path):
    part, expected = _fill_blocking(tmp_path)
    part.finish()
    first = read_all(part.create_view(1, 0, Listener()))
    second = read_all(part.create_view(1, 0, Listener()))
    assert first == second
    assert [(k, p) for k, p, _, _ in first] == expected[1] + [end_of(expected[1])]
    middle = read_all(part.create_view(1, 4, Listener()))
    assert middle == first[4:]
    assert middle[0][2] == 4
    with pytest.raises(ValueError, match="outside"):
        part.create_view(1, len(first) + 5, Listener())
    with pytest.raises(ValueError, match="outside"):
        part.create_view(1, -1, Listener())


def test_blocking_index_lists_every_buffer(tmp_path):
    part, expected = _fill_blocking(tmp_path, n=2, count=9)
    part.finish()
    assert part.spill.index_path.exists()
    data = part.spill.path.read_bytes()
    for s in range(2):
        entries = read_index(part.spill.index_path, s)
        assert [e[0] for e in entries] == list(range(len(expected[s]) + 1))  # + end of partition
        for (_seq, off, length, kind, _flags), (ekind, epayload) in zip(entries, expected[s]):
            assert kind == ekind
            assert data[off : off + length] == epayload
        assert entries[-1][3] == EOP
        assert data[entries[-1][1]:entries[-1][1] + entries[-1][2]] == end_of(expected[s])[1]
    assert len(data) == sum(len(p) for s in range(2) for _, p in expected[s]) + 2 * END_COUNTS.size


def test_blocking_index_flags_are_kept(tmp_path):
    part = make(tmp_path, "BLOCKING")
    part.add(0, DATA, 1, b"compressed")
    part.add(0, DATA, 0, b"plain")
    part.finish()
    entries = read_index(part.spill.index_path, 0)
    assert [(e[0], e[3], e[4]) for e in entries] == [(0, DATA, 1), (1, DATA, 0), (2, EOP, 0)]


# ------------------------------------------------------------------ HYBRID
def test_hybrid_pool_bounded_without_consumer_and_late_consumer_gets_all(tmp_path):
    slots = 4
    part = make(tmp_path, "HYBRID", n=2, slots=slots)
    expected = {0: [], 1: []}
    for i in range(50 * slots):
        s = i % 2
        part.add(s, DATA, 0, payload(i, s))
        expected[s].append(payload(i, s))
        assert part.pool.used <= part.pool.slots == slots
        assert part.free_slots >= 1  # HYBRID never blocks the writer
        assert part.pool.used_bytes <= slots * BUF
    part.finish()
    for s in (0, 1):
        first = read_all(part.create_view(s, 0, Listener()))
        assert [p for _, p, _, _ in first] == expected[s] + [END_COUNTS.pack(len(expected[s]), -1)]
        assert [seq for _, _, seq, _ in first] == list(range(len(expected[s]) + 1))
        second = read_all(part.create_view(s, 0, Listener()))
        assert second == first
        assert part.pool.used <= slots
    entries = read_index(part.spill.index_path, 1)
    assert len(entries) == len(expected[1]) + 1


def test_hybrid_pool_bounded_while_consumer_lags(tmp_path):
    part = make(tmp_path, "HYBRID", slots=3)
    view = part.create_view(0, 0, Listener())
    got = []
    for i in range(300):
        part.add(0, DATA, 0, payload(i))
        assert part.pool.used <= 3
        if i % 7 == 0:
            item, seq, _ = view.take()
            got.append((seq, bytes(item.payload)))
    part.finish()
    got += [(s, p) for _, p, s, _ in read_all(view)]
    assert got == [(i, payload(i)) for i in range(300)] + [(300, END_COUNTS.pack(300, -1))]
    assert part.pool.used == 0, "memory of streamed buffers must be released"


def test_hybrid_readable_while_running_and_resumable(tmp_path):
    part = make(tmp_path, "HYBRID", slots=8)
    listener = Listener()
    view = part.create_view(0, 0, listener)
    part.add(0, DATA, 0, b"a")
    part.add(0, DATA, 0, b"b")
    assert listener.calls >= 2
    item, seq, backlog = view.take()
    assert (bytes(item.payload), seq, backlog) == (b"a", 0, 1)
    # a reconnecting consumer resumes from what it has
    view.release()
    again = part.create_view(0, 1, Listener())
    item, seq, backlog = again.take()
    assert (bytes(item.payload), seq, backlog) == (b"b", 1, 0)
    assert again.next_is_event() is None


@pytest.mark.parametrize("spilled", [False, True])
def test_a_resumed_view_starts_at_a_held_buffer_and_refuses_any_other(tmp_path, spilled):
    """A reader going on where an earlier read stopped gets the buffers from there (from memory or from the spill
    file), and a position the subpartition does not hold is refused at once, never waited for."""
    part = make(tmp_path, "HYBRID", slots=2 if spilled else 8, budget=2 * BUF if spilled else 1 << 20)
    for i in range(5):
        part.add(0, DATA, 0, payload(i))
    if spilled:
        assert part.pool.used < 5 * len(payload(4)), "the small budget should have spilled buffers"
    got = [(seq, p) for _, p, seq, _ in read_all(part.create_view(0, 3, Listener(), resumed=True))]
    assert got == [(3, payload(3)), (4, payload(4))]
    waiting = part.create_view(0, 5, Listener(), resumed=True)  # the next buffer the writer appends
    assert waiting.next_is_event() is None
    part.add(0, DATA, 0, payload(5))
    assert [(seq, p) for _, p, seq, _ in read_all(waiting)] == [(5, payload(5))]
    for pos in (7, -1):
        with pytest.raises(ValueError, match=f"resume position {pos} is beyond subpartition 0 of partition p0: "
                                             r"it holds buffers 0\.\.5 \(being written"):
            part.create_view(0, pos, Listener(), resumed=True)
    part.finish()
    assert read_all(part.create_view(0, 6, Listener(), resumed=True))[0][0] == EOP  # the end event is held
    with pytest.raises(ValueError, match=r"resume position 7 is beyond .* 0\.\.6 \(finished"):
        part.create_view(0, 7, Listener(), resumed=True)  # after the end: nothing would ever come


def test_a_resumed_view_of_a_consumed_once_partition_refuses_released_buffers(tmp_path):
    part = make(tmp_path, "PIPELINED_BOUNDED", slots=4)
    for i in range(3):
        part.add(0, DATA, 0, payload(i))
    view = part.create_view(0, 0, Listener())
    view.take(), view.take()
    view.release()
    with pytest.raises(ValueError, match="resume position 1 .* is gone: buffers before 2 were released"):
        part.create_view(0, 1, Listener(), resumed=True)


# ------------------------------------------------------------------ broadcast
@pytest.mark.parametrize("ptype", ["HYBRID", "BLOCKING"])
def test_broadcast_reaches_every_subpartition_stored_once(tmp_path, ptype):
    n = 4
    part = make(tmp_path, ptype, n=n, slots=8)
    part.add(BROADCAST, DATA, 0, b"B" * 100)
    part.add(2, DATA, 0, b"only-two")
    part.add(BROADCAST, DATA, 0, b"C" * 50)
    part.finish()
    assert part.spill.size == os.path.getsize(part.spill.path) == 100 + 8 + 50 + n * END_COUNTS.size  # + the counts at the end
    for s in range(n):
        got = [p for k, p, _, _ in read_all(part.create_view(s, 0, Listener())) if k == DATA]
        assert got == ([b"B" * 100, b"only-two", b"C" * 50] if s == 2 else [b"B" * 100, b"C" * 50])
    offsets = {read_index(part.spill.index_path, s)[0][1] for s in range(n)}
    assert offsets == {0}, "every subpartition indexes the one stored copy"
    assert part.buffers_in == 3 and part.bytes_in == 158


def test_hybrid_broadcast_uses_one_slot(tmp_path):
    part = make(tmp_path, "HYBRID", n=3, slots=8)
    part.add(BROADCAST, DATA, 0, b"x")
    assert part.pool.used == 1
    for s in range(3):
        part.create_view(s, 0, Listener()).take()
    assert part.pool.used == 0


# ------------------------------------------------------------------ failure, release, errors
@pytest.mark.parametrize("ptype", ["PIPELINED_BOUNDED", "HYBRID", "BLOCKING"])
def test_fail_makes_views_yield_the_error(tmp_path, ptype):
    part = make(tmp_path, ptype, n=2)
    part.add(0, DATA, 0, b"x")
    listener = Listener()
    view = part.create_view(0, 0, listener)
    before = listener.calls
    part.fail("executor lost")
    assert listener.calls > before
    assert view.next_is_event() is True  # the error needs no credit
    item, _, backlog = view.take()
    assert item.kind == ERROR_KIND and backlog == 0
    assert "executor lost" in bytes(item.payload).decode()
    assert "p0" in bytes(item.payload).decode()
    assert view.next_is_event() is None
    # a view created after the failure sees it too
    late = part.create_view(1, 0, Listener())
    assert late.next_is_event() is True and late.take()[0].kind == ERROR_KIND
    with pytest.raises(PartitionStateError, match="does not accept"):
        part.add(0, DATA, 0, b"y")
    with pytest.raises(PartitionStateError, match="executor lost"):
        part.finish()


def test_fail_after_finish_is_ignored(tmp_path):
    part = make(tmp_path, "HYBRID")
    part.add(0, DATA, 0, b"x")
    part.finish()
    part.fail("too late")
    assert part.failure is None
    assert [k for k, _, _, _ in read_all(part.create_view(0, 0, Listener()))] == [DATA, EOP]


@pytest.mark.parametrize("ptype", ["HYBRID", "BLOCKING"])
def test_release_deletes_spill_files_and_returns_budget(tmp_path, ptype):
    budget = MemoryBudget(8 * BUF)
    part = ResultPartition("rel", 2, ptype, budget, 4, BUF, tmp_path)
    for i in range(10):
        part.add(i % 2, DATA, 0, payload(i))
    part.finish()
    view = part.create_view(0, 0, Listener())
    data_path, index_path = part.spill.path, part.spill.index_path
    assert data_path.exists() and index_path.exists()
    part.release("dropped")
    assert not data_path.exists() and not index_path.exists()
    assert not list(tmp_path.iterdir())
    assert budget.reserved_bytes == 0
    # a connected view is told at once, never left waiting: its next item is an error naming the release
    assert view.next_is_event() is True
    item, _, _ = view.take()
    assert item.kind == ERROR_KIND and b"partition rel of exchange '' was released: dropped" in bytes(item.payload)
    assert view.next_is_event() is None
    with pytest.raises(PartitionStateError, match="released"):
        part.create_view(0, 0, Listener())
    with pytest.raises(PartitionStateError):
        part.add(0, DATA, 0, b"x")
    part.release()  # idempotent


def test_budget_is_redistributed_as_partitions_come_and_go(tmp_path):
    """Registration never fails: a new partition shrinks the others' targets, a finished one gives its
    share back; a third partition is accepted though three full pools (12 buffers) exceed the budget (6)."""
    budget = MemoryBudget(6 * BUF)
    a = ResultPartition("a", 1, "HYBRID", budget, 4, BUF, tmp_path)
    assert a.pool.slots == 4
    b = ResultPartition("b", 1, "HYBRID", budget, 4, BUF, tmp_path)
    assert (a.pool.slots, b.pool.slots) == (3, 3)
    c = ResultPartition("c", 1, "PIPELINED_BOUNDED", budget, 4, BUF, tmp_path)
    assert (a.pool.slots, b.pool.slots, c.pool.slots) == (2, 2, 2)
    a.finish()  # on disk: no pool any more
    assert (a.pool.slots, b.pool.slots, c.pool.slots) == (0, 3, 3)
    grown = Listener()
    c.memory.set_on_credit(grown)
    b.release()
    assert c.pool.slots == 4 and grown.calls == 1  # the writer is told: more credit
    assert budget.used_bytes == 0


@pytest.mark.parametrize("ptype", ["PIPELINED_BOUNDED", "HYBRID", "BLOCKING"])
def test_subpartition_index_out_of_range(tmp_path, ptype):
    part = make(tmp_path, ptype, n=3)
    for bad in (3, 10, -2):
        with pytest.raises(PartitionStateError, match=rf"subpartition index {bad} is out of range 0..2"):
            part.add(bad, DATA, 0, b"x")
        with pytest.raises(IndexError, match=rf"subpartition index {bad} is out of range"):
            part.create_view(bad, 0, Listener())
    assert part.buffers_in == 0
    if part.spill is not None:
        assert part.spill.size == 0, "a refused buffer must not reach the spill file"


def test_no_subpartitions_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one subpartition"):
        make(tmp_path, "HYBRID", n=0)


def test_add_after_finish_refused(tmp_path):
    part = make(tmp_path, "HYBRID")
    part.finish()
    part.finish()  # idempotent
    with pytest.raises(PartitionStateError, match="does not accept"):
        part.add(0, DATA, 0, b"x")


@pytest.mark.skipif(not __import__("sparkflow_exchange.partition.shared_arena", fromlist=["x"]).available(),
                    reason="no writable /dev/shm")
@pytest.mark.parametrize("ptype", ["PIPELINED_BOUNDED", "HYBRID"])
def test_a_socket_never_gets_a_view_of_an_arena_slot(tmp_path, ptype):
    """A buffer in a writer's shared-memory slot, taken for a socket reader, is a copy: once its memory is
    dropped the writer may refill the slot, and a transport that kept the caller's view (allowed from
    Python 3.12) would then send another batch's bytes."""
    from sparkflow_exchange.partition.shared_arena import SharedArena

    arena = SharedArena.create(2, 4096)
    try:
        part = ResultPartition("arena-copy", 1, ptype, MemoryBudget(1 << 20), 2, 4096, tmp_path)
        original = b"A" * 1000
        arena.slot(0)[:1000] = original
        part.add(0, 0, 0, arena.slot(0)[:1000], arena_slot=0, arena=arena, arena_offset=0)
        view = part.create_view(0, 0, lambda: None)  # a socket reader (not shared)
        item, _seq, _backlog = view.take()
        arena.slot(0)[:1000] = b"B" * 1000  # the writer refills the slot
        assert bytes(item.payload) == original
        part.release()
    finally:
        arena.unlink()


def test_pooled_frame_buffers_are_not_reused_while_a_view_of_them_lives():
    from sparkflow_exchange.network.protocol import _FramePool

    pool = _FramePool(8 << 20)
    first = pool.take(300_000)
    payload = first[100:200]  # what a decoded message keeps
    del first
    second = pool.take(300_000)
    assert second.obj is not payload.obj  # still read through ``payload``: not handed out again
    keep = payload.obj
    del payload, second
    third = pool.take(300_000)
    assert third.obj is keep  # nothing reads it any more: reused


def test_a_released_partition_without_readers_is_freed_by_reference_counting(tmp_path):
    """No cycle left for the garbage collector: a service dropping wide exchanges spent seconds in it."""
    import gc
    import weakref

    gc.disable()
    try:
        part = make(tmp_path, "HYBRID", n=8)
        for sub in range(8):
            part.add(sub, BufferKind.DATA, 0, payload(sub, sub))
        part.finish()
        alive = weakref.ref(part.subpartitions[3])
        part.release("dropped")
        del part
        assert alive() is None
    finally:
        gc.enable()


# ------------------------------------------------------------------ a credential's share of the budget
@pytest.mark.parametrize("ptype", ["HYBRID", "PIPELINED_BOUNDED", "BLOCKING"])
def test_a_credentials_memory_account_holds_what_its_partitions_hold_and_returns_to_zero(tmp_path, ptype):
    """Credit, held buffers, the receive buffer and the subpartitions' bookkeeping are charged to the account
    as they are taken and given back as they go: after a finish, reads and a release nothing is left."""
    from sparkflow_exchange.partition.buffer_pool import SUBPARTITION_BYTES, MemoryAccount

    budget = MemoryBudget(64 * BUF)
    account = MemoryAccount("app-b", 6 * BUF + 2 * SUBPARTITION_BYTES)
    part = ResultPartition("acct", 2, ptype, budget, 16, BUF, tmp_path, account=account)
    fixed = 2 * SUBPARTITION_BYTES + (0 if ptype == "PIPELINED_BOUNDED" else BUF)  # a receive buffer
    assert account.bytes == fixed and budget.bookkeeping_bytes == 2 * SUBPARTITION_BYTES
    credit = part.memory.grant(0, 64)
    if ptype == "PIPELINED_BOUNDED":
        assert credit * BUF + fixed <= account.limit and account.free < BUF  # the share, not the budget, bounds it
        assert part.memory.grant(credit, 64) == 0 and "credential 'app-b' holds" in part.stats()["waiting_for"]
    items = min(credit, 5) if ptype == "PIPELINED_BOUNDED" else 10
    for i in range(items):
        part.add(i % 2, DATA, 0, payload(i))
        assert account.bytes <= account.limit
    part.finish()
    views = [part.create_view(s, 0, Listener()) for s in range(2)]
    for view in views:
        read_all(view)
    part.release("dropped")
    assert account.bytes == 0 and budget.bookkeeping_bytes == 0 and budget.reserved_bytes == 0
