"""Training plans (no torch): every row once under ``even``, equal steps per rank in every mode, resumes."""
from __future__ import annotations

import numpy as np
import pytest

from sparkflow_exchange.errors import ConfigError
from sparkflow_exchange.training_plan import (
    Balance,
    delivered,
    even_segments,
    plan_epoch,
    subpartition_order,
    whole_subpartitions,
)

CASES = [  # counts per subpartition: uniform, skewed, empty subpartitions, fewer subpartitions than readers
    np.full(16, 250),
    np.array([5000, 3, 0, 17, 900, 1, 0, 64, 2000, 0, 5, 40]),
    np.array([0, 0, 0, 1000, 0, 0, 0, 0]),
    np.array([3000, 10]),
]


@pytest.mark.parametrize("counts", CASES)
@pytest.mark.parametrize("ranks, workers, batch", [(2, 2, 32), (3, 1, 100), (1, 4, 7)])
def test_even_reads_every_row_once_in_equal_steps(counts, ranks, workers, batch):
    for epoch in range(3):
        order = subpartition_order(len(counts), seed=5, epoch=epoch, shuffle=True)
        readers = ranks * workers
        seen = [np.zeros(c, dtype=np.int64) for c in counts]
        for k in range(readers):
            for seg in even_segments(order, counts, readers, k):
                seen[seg.subpartition][seg.start:seg.stop] += 1
        assert all((s == 1).all() for s in seen)
        plan = plan_epoch(counts, order, ranks, workers, batch, Balance.EVEN)
        per_rank = {sum(len(plan.sizes[r * workers + w]) for w in range(workers)) for r in range(ranks)}
        assert per_rank == {plan.steps}
        assert all(max(s) <= batch and min(s) >= 1 for s in plan.sizes if s)
        assert sum(sum(s) for s in plan.sizes) == counts.sum()


@pytest.mark.parametrize("counts", CASES)
@pytest.mark.parametrize("balance", [Balance.DROP, Balance.PAD])
def test_drop_and_pad_give_every_rank_the_same_steps(counts, balance):
    ranks, workers, batch = 2, 2, 64
    order = subpartition_order(len(counts), seed=1, epoch=0, shuffle=True)
    plan = plan_epoch(counts, order, ranks, workers, batch, balance)
    steps = [sum(len(plan.sizes[r * workers + w]) for w in range(workers)) for r in range(ranks)]
    assert steps == [plan.steps] * ranks
    if balance is Balance.PAD:  # every row still read, pads on top
        real = sum(sum(s) for s in plan.sizes) - batch * sum(plan.pads)
        assert real == counts.sum()
    subs = sorted(s for k in range(ranks * workers) for s in whole_subpartitions(order, ranks * workers, k))
    assert subs == list(range(len(counts)))


def test_orders_differ_by_epoch_and_repeat_by_seed():
    a, b = subpartition_order(32, 3, 0, True), subpartition_order(32, 3, 1, True)
    assert sorted(a) == list(range(32)) and not (a == b).all()
    assert (a == subpartition_order(32, 3, 0, True)).all()
    assert (subpartition_order(32, 3, 0, False) == np.arange(32)).all()


def test_delivered_follows_the_dataloaders_round_robin():
    counts = [3, 1, 5]
    order = [w for i in range(max(counts)) for w in range(3) if i < counts[w]]  # round robin, skipping the done
    for steps in range(len(order) + 1):
        assert delivered(counts, steps) == [order[:steps].count(w) for w in range(3)]


def test_bad_plans_are_refused():
    with pytest.raises(ConfigError, match="unknown balance"):
        Balance.parse("evenly")
    with pytest.raises(ConfigError, match="too few"):
        plan_epoch(np.array([3]), np.array([0]), 2, 2, 1, Balance.EVEN)
