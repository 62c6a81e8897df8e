"""Credit-based flow control, sans-IO: the sender queue and the receiver's buffer bookkeeping.

The unit tests pin single rules; ``test_randomized_sender_receivers`` wires one
sender (PartitionRequestQueue) to several receivers (ChannelCredit sharing one
FloatingBufferPool) over in-memory FIFOs and checks the invariants after every
step of thousands of random interleavings.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import pytest

from sparkflow_exchange.buffer_kinds import BufferKind
from sparkflow_exchange.consumer.buffer_manager import ChannelCredit, FloatingBufferPool
from sparkflow_exchange.network.credit import PartitionRequestQueue
from sparkflow_exchange.network.protocol import ProtocolError

DATA = BufferKind.DATA
EOP = BufferKind.END_OF_PARTITION
MARKER = BufferKind.MARKER


@dataclass(frozen=True)
class FakeItem:
    kind: int
    payload: object


class FakeView:
    """A subpartition view over a list the test appends to."""

    def __init__(self) -> None:
        self.items: deque[FakeItem] = deque()
        self.seq = 0

    def add(self, kind: int, payload: object = None) -> None:
        self.items.append(FakeItem(kind, payload))

    def next_is_event(self):
        if not self.items:
            return None
        return self.items[0].kind != DATA

    def take(self):
        item = self.items.popleft()
        seq = self.seq
        self.seq += 1
        backlog = sum(1 for i in self.items if i.kind == DATA)
        return item, seq, backlog


def _drain(q: PartitionRequestQueue):
    out = []
    while (polled := q.poll()) is not None:
        out.append(polled)
    return out


# ------------------------------------------------------------------ sender unit tests
def test_no_data_without_credit_and_credit_counts_down():
    q = PartitionRequestQueue()
    v = FakeView()
    for i in range(5):
        v.add(DATA, i)
    q.add_view(1, v, initial_credit=2)
    sent = _drain(q)
    assert [s[1].payload for s in sent] == [0, 1]
    assert [(s[2], s[3]) for s in sent] == [(0, 4), (1, 3)]  # seq, backlog after the item
    assert q.credit_of(1) == 0
    assert q.poll() is None
    q.add_credit(1, 1)
    assert [s[1].payload for s in _drain(q)] == [2]
    assert q.credit_of(1) == 0 and q.poll() is None


def test_zero_initial_credit_sends_nothing_until_credit():
    q = PartitionRequestQueue()
    v = FakeView()
    v.add(DATA, "a")
    q.add_view(1, v, 0)
    assert q.poll() is None
    q.add_credit(1, 3)
    assert [s[1].payload for s in _drain(q)] == ["a"]
    assert q.credit_of(1) == 2


def test_events_pass_with_zero_credit_but_not_overtake_data():
    q = PartitionRequestQueue()
    v = FakeView()
    v.add(MARKER, "m")
    v.add(DATA, "d")
    v.add(EOP, "end")
    q.add_view(1, v, 0)
    sent = _drain(q)
    assert [s[1].payload for s in sent] == ["m"]  # the event went; data waits; end stays behind data
    assert q.credit_of(1) == 0
    q.add_credit(1, 1)
    assert [s[1].payload for s in _drain(q)] == ["d", "end"]
    assert q.credit_of(1) == 0  # the event did not consume credit


def test_fairness_two_views_alternate():
    q = PartitionRequestQueue()
    a, b = FakeView(), FakeView()
    for i in range(4):
        a.add(DATA, f"a{i}")
        b.add(DATA, f"b{i}")
    q.add_view(1, a, 10)
    q.add_view(2, b, 10)
    assert [s[1].payload for s in _drain(q)] == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_view_without_credit_does_not_block_others():
    q = PartitionRequestQueue()
    a, b = FakeView(), FakeView()
    for i in range(3):
        a.add(DATA, f"a{i}")
        b.add(DATA, f"b{i}")
    q.add_view(1, a, 0)
    q.add_view(2, b, 5)
    assert [s[0] for s in _drain(q)] == [2, 2, 2]
    q.add_credit(1, 1)
    assert [s[1].payload for s in _drain(q)] == ["a0"]


def test_data_arriving_later_needs_notify():
    q = PartitionRequestQueue()
    v = FakeView()
    q.add_view(1, v, 2)
    assert q.poll() is None
    v.add(DATA, "x")
    q.notify_available(1)
    q.notify_available(1)  # a second notify must not queue the view twice
    assert [s[1].payload for s in _drain(q)] == ["x"]


def test_sender_rejects_bad_credit_and_duplicate_receiver():
    q = PartitionRequestQueue()
    q.add_view(1, FakeView(), 1)
    with pytest.raises(ProtocolError, match="already in use"):
        q.add_view(1, FakeView(), 1)
    with pytest.raises(ProtocolError, match="negative initial credit"):
        q.add_view(2, FakeView(), -1)
    with pytest.raises(ProtocolError, match="credit must be positive"):
        q.add_credit(1, 0)
    q.add_credit(99, 1)  # credit for an unknown/cancelled receiver is ignored


def test_removed_view_is_skipped():
    q = PartitionRequestQueue()
    a, b = FakeView(), FakeView()
    a.add(DATA, "a")
    b.add(DATA, "b")
    q.add_view(1, a, 1)
    q.add_view(2, b, 1)
    assert q.remove(1) is a
    assert 1 not in q
    assert [s[0] for s in _drain(q)] == [2]


# ------------------------------------------------------------------ receiver unit tests
def _check_channel(ch: ChannelCredit) -> None:
    assert ch.announced + ch.in_use == ch.exclusive + ch.floating
    assert ch.announced >= 0 and ch.in_use >= 0 and ch.floating >= 0


def test_receiver_initial_credit_is_exclusive():
    pool = FloatingBufferPool(8)
    ch = ChannelCredit(2, pool, 1)
    assert ch.initial_credit() == 2 == ch.announced
    _check_channel(ch)
    with pytest.raises(ValueError):
        ChannelCredit(0, pool)


def test_receiver_refuses_data_without_credit_but_accepts_events():
    pool = FloatingBufferPool(0)
    ch = ChannelCredit(1, pool, 7)
    assert ch.on_buffer(DATA, 0) == []
    assert ch.on_buffer(MARKER, 0) == []  # events need no credit
    with pytest.raises(ProtocolError, match="receiver 7 got a data buffer without credit"):
        ch.on_buffer(DATA, 0)


def test_backlog_requests_floating_buffers_and_announces_them():
    pool = FloatingBufferPool(8)
    ch = ChannelCredit(2, pool, 1)
    # one buffer arrives, sender says 5 more are queued: announced 1, wants 4 more
    assert ch.on_buffer(DATA, 5) == [(ch, 4)]
    assert (ch.floating, ch.announced, ch.in_use, pool.free) == (4, 5, 1, 4)
    _check_channel(ch)
    # backlog already covered: nothing more requested
    assert ch.on_buffer(DATA, 4) == []
    assert pool.free == 4
    _check_channel(ch)


def test_floating_request_limited_by_pool_and_waiting_channel_served_on_recycle():
    pool = FloatingBufferPool(3)
    a = ChannelCredit(2, pool, 1)
    b = ChannelCredit(2, pool, 2)
    assert a.on_buffer(DATA, 4) == [(a, 3)]  # wanted 3 (= 4 - 1), got all 3
    assert pool.free == 0
    assert b.on_buffer(DATA, 5) == []  # wanted 4, pool empty: b waits
    assert b.wanted_floating() == 4
    # a consumes; its backlog is covered so the floating buffer goes back and is lent to b
    a.backlog = 0
    announcements = a.on_consumed()
    assert announcements == [(b, 1)]
    assert (a.floating, b.floating, pool.free) == (2, 1, 0)
    for ch in (a, b):
        _check_channel(ch)


def test_consumed_exclusive_buffer_is_reannounced():
    pool = FloatingBufferPool(4)
    ch = ChannelCredit(2, pool, 1)
    ch.on_buffer(DATA, 0)
    ch.on_buffer(DATA, 0)
    assert ch.announced == 0
    assert ch.on_consumed() == [(ch, 1)]
    assert ch.on_consumed() == [(ch, 1)]
    assert ch.announced == 2 and pool.free == 4
    _check_channel(ch)
    with pytest.raises(ValueError, match="consumed more buffers"):
        ch.on_consumed()


def test_consumed_floating_buffer_returns_to_pool_when_backlog_covered():
    pool = FloatingBufferPool(4)
    ch = ChannelCredit(1, pool, 1)
    assert ch.on_buffer(DATA, 3) == [(ch, 3)]
    assert (ch.floating, pool.free) == (3, 1)
    for backlog in (2, 1, 0):
        ch.on_buffer(DATA, backlog)
    assert ch.in_use == 4 and ch.announced == 0
    got = [ch.on_consumed() for _ in range(4)]
    # backlog 0 is covered: the three floating buffers go back first, then the exclusive is re-announced
    assert ch.floating == 0 and pool.free == 4
    assert ch.announced == 1  # only the exclusive buffer remains announced
    assert sum(n for acts in got for _, n in acts) == 1
    _check_channel(ch)


def test_consumed_floating_kept_while_backlog_exceeds_credit():
    pool = FloatingBufferPool(2)
    ch = ChannelCredit(1, pool, 1)
    assert ch.on_buffer(DATA, 10) == [(ch, 2)]
    assert ch.on_consumed() == [(ch, 1)]  # backlog 10 > announced: keep the floating buffer as credit
    assert ch.floating == 2 and pool.free == 0
    _check_channel(ch)


def test_close_returns_idle_floating_and_lends_to_waiting():
    pool = FloatingBufferPool(2)
    a = ChannelCredit(1, pool, 1)
    b = ChannelCredit(1, pool, 2)
    assert a.on_buffer(DATA, 5) == [(a, 2)]
    assert b.on_buffer(DATA, 3) == []  # b waits for 3
    acts = a.close()
    assert acts == [(b, 1), (b, 1)]
    assert (a.floating, b.floating, pool.free) == (0, 2, 0)
    _check_channel(b)
    # a's in-use exclusive buffer consumed after close: no announcement for a closed channel
    assert a.on_consumed() == []


# ------------------------------------------------------------------ randomized model
class Sim:
    """One sender connection to several receivers; FIFOs stand in for the TCP streams."""

    def __init__(self, rng: random.Random, n_channels: int, exclusive: int, floating: int) -> None:
        self.rng = rng
        self.queue = PartitionRequestQueue()
        self.pool = FloatingBufferPool(floating)
        self.views: dict[int, FakeView] = {}
        self.channels: dict[int, ChannelCredit] = {}
        self.produced: dict[int, list] = {}
        self.received: dict[int, deque] = {}  # data delivered, not consumed yet
        self.consumed: dict[int, list] = {}  # data the reader consumed
        self.arrived: dict[int, list] = {}  # data and markers in arrival order
        self.sender_credit: dict[int, int] = {}  # the test's own model of the sender's credit
        self.finished: set[int] = set()
        self.closed: set[int] = set()
        self.data_wire: deque = deque()  # sender -> receivers: (rid, item, seq, backlog)
        self.credit_wire: deque = deque()  # receivers -> sender: (rid, n)
        self.next_seq: dict[int, int] = {}
        self.counter = 0
        for rid in range(n_channels):
            view = FakeView()
            ch = ChannelCredit(exclusive, self.pool, rid)
            self.views[rid] = view
            self.channels[rid] = ch
            self.produced[rid] = []
            self.received[rid] = deque()
            self.consumed[rid] = []
            self.arrived[rid] = []
            self.next_seq[rid] = 0
            self.queue.add_view(rid, view, ch.initial_credit())
            self.sender_credit[rid] = ch.initial_credit()

    # ---- actions; each returns whether it did something
    def produce(self) -> bool:
        live = [r for r in self.views if r not in self.finished]
        if not live:
            return False
        rid = self.rng.choice(live)
        self.counter += 1
        if self.rng.random() < 0.1:
            self.views[rid].add(MARKER, ("marker", self.counter))
            self.produced[rid].append(("marker", self.counter))
        else:
            self.views[rid].add(DATA, self.counter)
            self.produced[rid].append(self.counter)
        self.queue.notify_available(rid)
        return True

    def finish(self, rid: int) -> None:
        self.views[rid].add(EOP, "eop")
        self.finished.add(rid)
        self.queue.notify_available(rid)

    def send(self) -> bool:
        before = dict(self.sender_credit)
        polled = self.queue.poll()
        if polled is None:
            # nothing may be sent: then no view has (data and credit) or an event
            for rid, view in self.views.items():
                ev = view.next_is_event()
                assert not (ev is True or (ev is False and self.queue.credit_of(rid) > 0)), (
                    f"poll returned None although receiver {rid} is sendable"
                )
            return False
        rid, item, seq, backlog = polled
        if item.kind == DATA:
            assert before[rid] > 0, f"data sent to receiver {rid} with zero credit"
            self.sender_credit[rid] -= 1
        assert self.queue.credit_of(rid) == self.sender_credit[rid] >= 0
        self.data_wire.append((rid, item, seq, backlog))
        return True

    def _announce(self, acts) -> None:
        for ch, n in acts:
            assert n > 0, "announced a non-positive credit"
            if ch.receiver_id in self.closed:
                continue  # as InputChannel.send_credit: a finished channel sends no credit
            self.credit_wire.append((ch.receiver_id, n))

    def deliver_buffer(self) -> bool:
        if not self.data_wire:
            return False
        rid, item, seq, backlog = self.data_wire.popleft()
        assert seq == self.next_seq[rid], "buffers out of order"
        self.next_seq[rid] += 1
        ch = self.channels[rid]
        self._announce(ch.on_buffer(item.kind, backlog))  # raises if data came without credit
        if item.kind == DATA:
            self.received[rid].append(item.payload)
            self.arrived[rid].append(item.payload)
        elif item.kind == MARKER:
            self.arrived[rid].append(item.payload)
        else:
            self.closed.add(rid)
            self._announce(ch.close())
        return True

    def deliver_credit(self) -> bool:
        if not self.credit_wire:
            return False
        rid, n = self.credit_wire.popleft()
        self.queue.add_credit(rid, n)
        self.sender_credit[rid] += n
        return True

    def consume(self) -> bool:
        ready = [r for r, q in self.received.items() if q]
        if not ready:
            return False
        rid = self.rng.choice(ready)
        self.consumed[rid].append(self.received[rid].popleft())
        self._announce(self.channels[rid].on_consumed())
        return True

    # ---- invariants, after every step
    def check(self) -> None:
        pool = self.pool
        assert 0 <= pool.free <= pool.size
        assert pool.free + sum(ch.floating for ch in self.channels.values()) == pool.size
        for rid, ch in self.channels.items():
            assert ch.in_use == len(self.received[rid])
            assert ch.announced >= 0 and ch.floating >= 0
            credit_in_flight = sum(n for r, n in self.credit_wire if r == rid)
            data_in_flight = sum(1 for r, item, _, _ in self.data_wire if r == rid and item.kind == DATA)
            sender = self.queue.credit_of(rid)
            assert sender == self.sender_credit[rid] >= 0
            if rid in self.closed:
                # closing hands idle floating credit back without telling the sender
                assert ch.announced + ch.in_use <= ch.exclusive + ch.floating
                assert sender + credit_in_flight + data_in_flight >= ch.announced
            else:
                assert ch.announced + ch.in_use == ch.exclusive + ch.floating
                # every credit the receiver counts as announced is at the sender, on the
                # wire as AddCredit, or already spent on a data buffer still on the wire
                assert sender + credit_in_flight + data_in_flight == ch.announced, (
                    rid, sender, credit_in_flight, ch.announced, data_in_flight)

    def run(self, steps: int, weights: list[float] | None = None) -> None:
        actions = [self.produce, self.send, self.deliver_buffer, self.deliver_credit, self.consume]
        if weights is None:  # per-seed skew: fast/slow producer, reader, network
            weights = [self.rng.uniform(0.5, 3) for _ in actions]
        for _ in range(steps):
            self.rng.choices(actions, weights)[0]()
            self.check()
        for rid in self.views:
            self.finish(rid)
            self.check()
        # drain in random order; stop when nothing can move
        movers = [self.send, self.deliver_buffer, self.deliver_credit, self.consume]
        for _ in range(1_000_000):
            order = movers[:]
            self.rng.shuffle(order)
            if not any(m() for m in order):
                break
            self.check()
        else:  # pragma: no cover
            raise AssertionError("drain did not terminate")

    def verify_complete(self) -> None:
        assert not self.data_wire
        for rid in self.views:
            assert rid in self.closed, f"receiver {rid} never got end of partition (stuck: credit deadlock?)"
            assert self.arrived[rid] == self.produced[rid], f"receiver {rid}: not exactly once, in order"
            data = [x for x in self.produced[rid] if not isinstance(x, tuple)]
            assert self.consumed[rid] == data
            assert not self.views[rid].items
            assert self.channels[rid].in_use == 0
        assert self.pool.free == self.pool.size, "floating buffers leaked"


@pytest.mark.parametrize(
    "seed, n_channels, exclusive, floating",
    [
        (1, 3, 2, 8),
        (2, 4, 1, 2),
        (3, 2, 2, 0),
        (4, 5, 1, 1),
        (5, 3, 3, 4),
        (6, 1, 1, 8),
        (7, 6, 2, 3),
        (8, 4, 2, 8),
        (9, 8, 1, 4),
        (10, 2, 1, 16),
        (11, 3, 2, 1),
        (12, 4, 2, 2),
    ],
)
def test_randomized_sender_receivers(seed, n_channels, exclusive, floating):
    sim = Sim(random.Random(seed), n_channels, exclusive, floating)
    sim.run(4000)
    sim.verify_complete()
    assert sum(len(v) for v in sim.produced.values()) > 100


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_randomized_slow_reader_contends_for_floating_buffers(seed, monkeypatch):
    """A slow reader builds backlogs, so channels compete for a small floating pool."""
    lent = []
    recycle = FloatingBufferPool.recycle

    def counting_recycle(self):
        out = recycle(self)
        lent.extend(out)
        return out

    monkeypatch.setattr(FloatingBufferPool, "recycle", counting_recycle)
    sim = Sim(random.Random(seed), 4, 1, 3)
    # produce, send, deliver buffer, deliver credit, consume
    sim.run(4000, weights=[3, 3, 3, 3, 1])
    sim.verify_complete()
    assert lent, "no floating buffer was ever lent to a waiting channel: the test lost its teeth"


# ---------------------------------------------------------------- a real read over TCP: credit returned in batches
@pytest.mark.parametrize("exclusive,floating", [(1, 0), (2, 8), (8, 0)])
def test_remote_read_returns_credit_in_batches_and_reads_every_row(tmp_service, monkeypatch, exclusive, floating):
    """A reader on another host (TCP) reading a write still in progress under a bounded partition: the writer
    waits on the reader's credit, so credit held back by the reader would stall it. Every row arrives once, and
    the credit returned in batches (one AddCredit per channel every half of its credit, and all of it whenever
    the reader would wait) adds up to the buffers the reader freed, no message larger than a channel's window."""
    import threading

    import numpy as np
    import pyarrow as pa

    import sparkflow_exchange as sfe
    from sparkflow_exchange.consumer.input_channel import InputChannel

    svc = tmp_service(host_id="hostA")
    common = dict(coordinator=svc.tcp, service=svc.tcp, secret=svc.secret)
    sent: list[int] = []
    original = InputChannel.send_credit

    def counting(self, n):
        sent.append(n)
        original(self, n)
    monkeypatch.setattr(InputChannel, "send_credit", counting)
    schema = pa.schema([("id", pa.int64())])
    total = 40_000
    name = f"credit-batches-{exclusive}-{floating}"
    writer = sfe.open_writer(name, schema, keys=["id"], num_subpartitions=1, partitionType="PIPELINED_BOUNDED",
                             bufferSize="4k", buffersPerPartition="2", hostId="hostA", **common)
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with writer as w:
                for start in range(0, total, 1000):
                    w.write(pa.record_batch([pa.array(np.arange(start, start + 1000, dtype=np.int64))], schema=schema))
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    thread = threading.Thread(target=write, daemon=True)  # declared already: the reader finds it
    thread.start()
    seen = []
    buffers = 0
    with sfe.open_reader(name, hostId="elsewhere", buffersPerChannel=str(exclusive),
                         floatingBuffersPerGate=str(floating), readerTimeout="60s", **common) as reader:
        for batch in reader:
            buffers += 1
            seen.append(batch.column(0).to_numpy())
    thread.join(60)
    assert not thread.is_alive() and not failures, failures
    ids = np.sort(np.concatenate(seen))
    assert ids.tolist() == list(range(total))
    # every freed buffer came back as credit (the last ones may not: the channel had ended), never more
    assert buffers - exclusive - floating <= sum(sent) <= buffers + floating, (sum(sent), buffers)
    assert max(sent) <= exclusive + floating, sent  # a channel never holds more credit than its window


@pytest.mark.parametrize("producers,exclusive,floating", [(4, 1, 0), (4, 1, 1), (4, 2, 3), (1, 1, 3), (1, 1, 2)])
def test_a_remote_read_with_a_small_window_never_stalls(tmp_service, producers, exclusive, floating):
    """Channels with hardly any credit (four producers' channels sharing one gate, or one channel whose window
    shrinks to its one exclusive buffer as the backlog ends): a sender runs out after a buffer or two, so nothing
    arrives to carry its credit back and the reading task must hand it over itself, even when less than a batch
    waits (floating buffers move between the channels the same way). Every row arrives; a stall is a timeout."""
    import numpy as np
    import pyarrow as pa
    from harness import client_config

    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange import write_handle as wh

    svc = tmp_service(host_id="hostA")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    config = client_config(svc, exchange=f"small-window-{producers}-{exclusive}-{floating}", partitioner="hash", keys="id",
                           numSubpartitions=1, partitionType="BLOCKING", bufferSize="8k", hostId="elsewhere",
                           buffersPerChannel=str(exclusive), floatingBuffersPerGate=str(floating),
                           readerTimeout="20s")
    handle = ex.declare_write(config, schema, overwrite=True)
    parts, per = [], 20_000
    for p in range(producers):
        task = ex.ProducerTask(handle, p, f"a{p}")
        task.write([pa.record_batch([pa.array(np.arange(p * per, (p + 1) * per, dtype=np.int64))], schema=schema)])
        parts.append(task.finish()["partition"])
    wh.commit_write(handle, parts)
    desc = ex.describe_exchange(config)
    gate_buffers = 0
    ids = []
    for batch in ex.read_subpartition(config, desc, 0):
        gate_buffers += 1
        ids.append(batch.column(0).to_numpy())
    assert gate_buffers > producers * 8  # many buffers per channel, against a window of a few
    assert np.sort(np.concatenate(ids)).tolist() == list(range(producers * per))
