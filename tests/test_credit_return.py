"""The hand-off of finished buffers' credit between a read's task thread and its IO thread (no sockets, no threads:
each interleaving is played out step by step)."""
from __future__ import annotations

import random

import pytest

from sparkflow_exchange.consumer.credit_return import CreditAsk, CreditReturn


def test_a_batch_of_one_channels_buffers_does_not_strand_a_silent_senders_credit():
    """The interleaving that once hung a read: channel a's buffers fill a batch and the task thread asks for it;
    before the IO thread acts, the task thread also finishes silent channel b's buffer and would wait. The batch
    returns a's credit only; b's sender, holding no credit, sends nothing, so only the ask before waiting can
    return b's: after the IO thread did both asks nothing is left."""
    credit = CreditReturn[str](batch=2)
    assert credit.arrived("b", sender_credit=0) == {}  # b sent its whole window: silent from now on
    assert credit.arrived("a", sender_credit=3) == {}
    assert credit.arrived("a", sender_credit=2) == {}
    asks = [credit.finished("a"), credit.finished("a"), credit.finished("b")]
    assert asks == [None, CreditAsk.BATCH, None]  # one batch asked: the second is on its way
    assert credit.before_wait() is CreditAsk.ALL
    # the IO thread runs the asks in order
    assert credit.take(CreditAsk.BATCH) == {"a": 2}
    assert credit.take(CreditAsk.ALL) == {"b": 1}
    assert len(credit) == 0
    assert credit.before_wait() is None  # nothing noted: the next wait asks for nothing


def test_arrivals_return_credit_in_batches_without_the_task_thread_asking():
    """While every sender holds credit, the task thread never asks: each arrival returns a batch once one is
    noted, one count per channel."""
    credit = CreditReturn[str](batch=3)
    assert [credit.finished(c) for c in "abab"] == [None] * 4
    assert credit.arrived("a", sender_credit=5) == {"a": 2, "b": 1}
    assert credit.arrived("b", sender_credit=5) == {}  # one noted, less than a batch
    assert len(credit) == 1
    assert credit.take(CreditAsk.ALL) == {"b": 1}


def test_a_sender_with_credit_again_is_no_longer_silent():
    credit = CreditReturn[str](batch=2)
    credit.arrived("a", sender_credit=0)
    assert credit.finished("a") is None and credit.finished("a") is CreditAsk.BATCH
    assert credit.take(CreditAsk.BATCH) == {"a": 2}
    credit.credit_sent("a")
    assert credit.finished("a") is None and credit.finished("a") is None  # no silent sender: arrivals return it


def test_a_batch_holds_at_least_one_buffer():
    with pytest.raises(ValueError, match="at least one buffer"):
        CreditReturn(batch=0)


@pytest.mark.parametrize(("exclusive", "floating", "batch"), [(2, 8, 5), (2, 0, 1), (1, 0, 1), (4, 4, 4)])
def test_a_batch_is_half_a_channels_window(exclusive, floating, batch):
    assert CreditReturn.for_window(exclusive, floating).batch == batch


@pytest.mark.parametrize("seed", range(300))
def test_no_interleaving_leaves_a_reader_waiting_on_credit_it_holds(seed):
    """Random reads of 1-4 channels with windows of 1-4 buffers (seeded): the IO thread delivers buffers while
    senders hold credit, runs the task thread's asks at random moments, and sends credit back; the task thread
    consumes what is ready and otherwise waits. Whenever it waits and the IO thread has run every ask, no sender
    may be out of credit while the reader holds it (that read would wait forever), and every buffer's credit
    comes back exactly once by the end."""
    rng = random.Random(seed)
    channels = list(range(rng.randint(1, 4)))
    window = {c: rng.randint(1, 4) for c in channels}
    to_send = {c: rng.randint(0, 30) for c in channels}
    total = sum(to_send.values())
    credit = CreditReturn[int](batch=max(1, rng.choice([1, 2, 3, 4])))
    sender_credit = dict(window)
    ready: list[int] = []  # buffers queued for the task thread
    asks: list[CreditAsk] = []  # asks on their way to the IO thread
    returned = 0
    consumed = 0
    previous: int | None = None

    def give(back: dict[int, int]) -> None:
        nonlocal returned
        for c, n in back.items():
            sender_credit[c] += n
            returned += n
            credit.credit_sent(c)

    def io_step() -> bool:
        """One IO-thread action, if any is possible."""
        options = []
        if asks:
            options.append("ask")
        sendable = [c for c in channels if to_send[c] and sender_credit[c] > 0]
        if sendable:
            options.append("send")
        if not options:
            return False
        if rng.choice(options) == "ask":
            give(credit.take(asks.pop(0)))
        else:
            c = rng.choice(sendable)
            to_send[c] -= 1
            sender_credit[c] -= 1
            ready.append(c)
            give(credit.arrived(c, sender_credit[c]))
        return True

    for _ in range(20_000):
        if consumed == total:
            break
        if rng.random() < 0.5 and io_step():
            continue
        # the task thread
        if previous is not None:
            ask = credit.finished(previous)
            previous = None
            if ask is not None:
                asks.append(ask)
        if ready:
            previous = ready.pop(0)
            consumed += 1
            continue
        ask = credit.before_wait()
        if ask is not None:
            asks.append(ask)
        while io_step():  # waiting: only the IO thread moves
            if ready:
                break
        if not ready:
            stuck = [c for c in channels if to_send[c] and sender_credit[c] == 0]
            assert not stuck, f"channels {stuck} wait for credit the reader holds ({len(credit)} buffers noted)"
    assert consumed == total
    if previous is not None:
        credit.finished(previous)
    give(credit.take(CreditAsk.ALL))
    assert returned == total and len(credit) == 0
