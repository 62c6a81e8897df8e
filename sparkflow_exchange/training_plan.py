"""Which rows each (rank, DataLoader worker) reads in an epoch, and in how many batches (no torch here).

A training job of R ranks with W DataLoader workers each has K = R x W readers. Every epoch the
subpartitions are put in an order drawn from ``(seed, epoch)``, and each reader gets its share of the
committed rows (``subpartition_rows``, summed by the coordinator at commit). DDP needs the same number
of steps on every rank, or its collectives hang; the balance modes get there three ways:

- ``even``: the rows in that order are cut into K nearly equal ranges (a subpartition may be shared by
  two readers, each reading its part); every reader makes the same number of batches. Every row once.
- ``drop``: each reader takes whole subpartitions; every rank stops at the smallest rank's step count.
- ``pad``: each reader takes whole subpartitions; ranks with fewer steps repeat some of their own rows
  up to the largest rank's count. Whole subpartitions need no counts to start, so ``pad`` alone can
  start while the exchange is still written (the counts are needed only at the end).

Batches leave the DataLoader in worker order, round robin, skipping exhausted workers (``in_order``),
so a step count maps to how many batches each worker has delivered: that is what a resume skips.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


class Balance(enum.Enum):
    EVEN = "even"
    DROP = "drop"
    PAD = "pad"

    @classmethod
    def parse(cls, value: "str | Balance") -> "Balance":
        try:
            return value if isinstance(value, Balance) else cls(str(value).lower())
        except ValueError:
            raise ConfigError(f"unknown balance {value!r}; use even, drop or pad") from None


@dataclass(frozen=True)
class Segment:
    """Rows [start, stop) of one subpartition, in its reading order (producers in commit order)."""

    subpartition: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _ceil_div(a: int, b: int) -> int:
    """a / b rounded up, in integers (no float rounding on large counts)."""
    return -(-a // b)


def subpartition_order(num_subpartitions: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The epoch's order of subpartitions: a permutation drawn from (seed, epoch), or 0..n-1."""
    if not shuffle:
        return np.arange(num_subpartitions)
    return np.random.default_rng([seed, epoch]).permutation(num_subpartitions)


def whole_subpartitions(order: np.ndarray, readers: int, reader: int) -> list[int]:
    """Reader ``reader``'s whole subpartitions (drop and pad): every ``readers``-th of the epoch's order."""
    return sorted(int(s) for s in order[reader::readers])


def even_segments(order: np.ndarray, counts: np.ndarray, readers: int, reader: int) -> list[Segment]:
    """Reader ``reader``'s range of the rows laid out in the epoch's order (the total cut into ``readers``
    ranges that differ by at most one row)."""
    total = int(counts.sum())
    lo = reader * (total // readers) + min(reader, total % readers)
    hi = lo + total // readers + (1 if reader < total % readers else 0)
    ends = np.cumsum(counts[order])
    starts = ends - counts[order]
    segments = []
    for i in np.flatnonzero((ends > lo) & (starts < hi)):
        a, b = max(lo, int(starts[i])), min(hi, int(ends[i]))
        segments.append(Segment(int(order[i]), a - int(starts[i]), b - int(starts[i])))
    return segments


def even_rows(total: int, readers: int, reader: int) -> int:
    return total // readers + (1 if reader < total % readers else 0)


def batch_sizes(rows: int, batches: int, batch_size: int) -> list[int]:
    """``rows`` in exactly ``batches`` batches of at most ``batch_size``: full ones first, none empty."""
    sizes = []
    left = rows
    for i in range(batches):
        size = min(batch_size, left - (batches - i - 1))
        sizes.append(size)
        left -= size
    if left or (sizes and min(sizes) < 1):
        raise ConfigError(f"{rows} rows cannot make {batches} batches of 1 to {batch_size} rows")
    return sizes


def plain_batches(rows: int, batch_size: int) -> list[int]:
    full, rest = divmod(rows, batch_size)
    return [batch_size] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class EpochPlan:
    """Every reader's batches in one epoch; ``sizes[k]`` the row counts of reader k's batches (pad batches
    included, ``pads[k]`` of them at its end)."""

    sizes: list[list[int]]
    pads: list[int]
    steps: int  # the same on every rank

    def reader_batches(self, reader: int) -> list[int]:
        return self.sizes[reader]


def plan_epoch(counts: np.ndarray, order: np.ndarray, ranks: int, workers: int, batch_size: int,
               balance: Balance) -> EpochPlan:
    """Batch sizes of every reader (reader = rank x workers + worker) with equal steps on every rank."""
    readers = ranks * workers
    if balance is Balance.EVEN:
        total = int(counts.sum())
        per_reader = _ceil_div(_ceil_div(total, readers), batch_size) if total else 0
        if total and total // readers < per_reader:
            raise ConfigError(
                f"the exchange has {total} rows: too few for {readers} readers ({ranks} ranks x {workers} workers) "
                f"to make {per_reader} batches each; use fewer workers or a larger batch_size")
        sizes = [batch_sizes(even_rows(total, readers, k), per_reader, batch_size) for k in range(readers)]
        return EpochPlan(sizes, [0] * readers, per_reader * workers)
    sizes = [plain_batches(int(counts[whole_subpartitions(order, readers, k)].sum()), batch_size)
             for k in range(readers)]
    per_rank = [sum(len(sizes[r * workers + w]) for w in range(workers)) for r in range(ranks)]
    pads = [0] * readers
    if balance is Balance.DROP:
        steps = min(per_rank)
        for r in range(ranks):
            keep = delivered([len(sizes[r * workers + w]) for w in range(workers)], steps)
            for w in range(workers):
                sizes[r * workers + w] = sizes[r * workers + w][:keep[w]]
        return EpochPlan(sizes, pads, steps)
    steps = max(per_rank)
    for r in range(ranks):
        extra = steps - per_rank[r]
        mine = [r * workers + w for w in range(workers)]
        givers = [k for k in mine if sizes[k]] or mine  # a rank with no rows at all pads from others' rows
        for i in range(extra):
            k = givers[i % len(givers)]
            pads[k] += 1
            sizes[k] = sizes[k] + [batch_size]
    return EpochPlan(sizes, pads, steps)


def delivered(batches_per_worker: list[int], steps: int) -> list[int]:
    """How many batches each worker has delivered after ``steps`` steps of a DataLoader that takes them
    round robin in worker order, skipping workers that ran out."""
    left = list(batches_per_worker)
    taken = [0] * len(left)
    full_rounds = min(min(left) if left else 0, steps // max(len(left), 1))
    for w in range(len(left)):
        taken[w] += full_rounds
        left[w] -= full_rounds
    steps -= full_rounds * len(left)
    while steps > 0 and any(left):
        for w in range(len(left)):
            if steps == 0:
                break
            if left[w]:
                taken[w] += 1
                left[w] -= 1
                steps -= 1
    return taken
