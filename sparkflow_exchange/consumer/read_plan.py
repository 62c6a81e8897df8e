"""Read partitions of an exchange: one per subpartition, or adjacent subpartitions coalesced (Spark's AQE).

A Python read task costs Spark about 35 ms whatever it reads, so 200 read
tasks of tiny subpartitions cannot be fast. When the writer did not give
``numSubpartitions`` (the width is the session's ``spark.sql.shuffle.partitions``)
and the exchange is sealed, the reader groups adjacent subpartitions into read
partitions of about ``advisoryPartitionSize`` bytes, as Spark's
``ShufflePartitionsUtil.coalescePartitions`` does for ``repartition(col)``:
whole subpartitions are grouped, so every key stays in one read partition.

Skew (option ``splitSkewedSubpartitions``): a subpartition above both
``skewedPartitionFactor`` times the median and ``skewedPartitionThreshold``
is read by several tasks, each a contiguous range of its producers, as Spark's
skew join splits a skewed shuffle partition by ranges of map outputs. Its keys
then span read partitions. The coordinator keeps per-subpartition totals, not
per-producer sizes (2,000 x 2,000 of them would cost the service 16 MB per
exchange), so the ranges hold equal numbers of producers: balanced when the
producers are (Spark's tasks usually are), never wrong when they are not.

A read planned while its exchange is written has no sizes to coalesce by, and its tasks
read as the producers write: a task waiting for a slot until the write commits would
overlap nothing. So it is laid out to the reading application's task slots (Flink
schedules every consumer of a pipelined exchange together): m = min(slots, n) read
partitions, read partition j reading subpartitions {j, j+m, j+2m, ...}; for a hash
exchange written with ``numSubpartitions`` m is the largest divisor of n within the
slots, since pmod(h, n) mod m = pmod(h, m) when m divides n: partition j then holds
exactly the keys ``repartition(m, keys)`` puts in partition j. ``readPartitions=m``
asks for m (same rule) whether sealed or not.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .. import contract
from ..errors import ConfigError
from ..kinds import Partitioner

if TYPE_CHECKING:
    from ..description import ExchangeDescription

READ_PARTITIONS = "readPartitions"  # the option's key and default: the contract's, as the JVM reader takes them
AUTO: str = contract.load()["options"]["keys"][READ_PARTITIONS]["default"]

# what an input gate reads of a producer; the rest of the coordinator's entry stays on the driver
GATE_FIELDS = ("index", "partition", "state", "reason", "spill", "location", "replicas")  # replicas: where to go on

SMALL_PARTITION_FACTOR = 0.2  # Spark: a partition below 20% of the target is merged into a neighbour...
MERGED_PARTITION_FACTOR = 1.2  # ...when the merged partition stays within 120% of it


def coalesce(sizes: Sequence[int], target: int) -> list[tuple[int, int]]:
    """Ranges [start, end) covering every subpartition, each about ``target`` bytes.

    Greedy adjacent packing: a new range starts before subpartition i when adding it would pass the target
    (an oversized subpartition gets a range of its own). Then, as Spark does, a range below 20% of the target
    is merged into its smaller neighbour if the result stays within 120% of it (tiny tails do not get a task).
    """
    n = len(sizes)
    if n == 0:
        return []
    target = max(int(target), 1)
    ranges: list[list[int]] = []  # [start, end, bytes]
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > start and size > 0 and acc + size > target:
            ranges.append([start, i, acc])
            start, acc = i, 0
        acc += size
    ranges.append([start, n, acc])
    return [(s, e) for s, e, _ in _merge_small(ranges, target)]


def _merge_small(ranges: list[list[int]], target: int) -> list[list[int]]:
    small, merged_max = target * SMALL_PARTITION_FACTOR, target * MERGED_PARTITION_FACTOR
    out = list(ranges)
    i = 0
    while i < len(out) and len(out) > 1:
        start, end, size = out[i]
        if size >= small:
            i += 1
            continue
        prev = out[i - 1] if i > 0 else None
        nxt = out[i + 1] if i + 1 < len(out) else None
        # merge into the smaller neighbour that keeps the result within bounds
        candidates = [(nb[2], j) for nb, j in ((prev, i - 1), (nxt, i + 1)) if nb is not None and nb[2] + size <= merged_max]
        if not candidates:
            i += 1
            continue
        _, j = min(candidates)
        lo, hi = min(i, j), max(i, j)
        out[lo:hi + 1] = [[out[lo][0], out[hi][1], out[lo][2] + out[hi][2]]]
        i = lo  # the merged range may still be small
    return out


@dataclass(frozen=True)
class ReadRange:
    """One read partition: subpartitions [start, end) of the producers [first, last) in commit order
    (``producers`` None: of every producer); with ``stride``, subpartitions start, start + stride, ... below
    end, each read through a channel of its own (a read laid out to fewer partitions than subpartitions)."""

    start: int
    end: int
    producers: tuple[int, int] | None = None
    stride: int | None = None

    def subpartitions(self) -> range:
        """The subpartitions this read partition reads."""
        return range(self.start, self.end, self.stride or 1)


@dataclass(frozen=True)
class SkewRule:
    factor: float  # skewed above factor x the median subpartition...
    threshold: int  # ...and above this many bytes


def skewed_subpartitions(sizes: Sequence[int], rule: SkewRule) -> list[int]:
    """The subpartitions Spark's skew join would call skewed: above max(threshold, factor x median)."""
    if not sizes:
        return []
    limit = max(rule.threshold, rule.factor * statistics.median(sizes))
    return [i for i, size in enumerate(sizes) if size > limit]


def plan_ranges(sizes: Sequence[int], target: int, producers: int, rule: SkewRule | None) -> list[ReadRange]:
    """Coalesced read partitions; with ``rule``, each skewed subpartition stands alone and is split into
    about size / max(target, median) ranges of producers (at most one per producer)."""
    skewed = skewed_subpartitions(sizes, rule) if rule is not None else []
    piece = max(int(target), int(statistics.median(sizes)), 1) if skewed else 0
    out: list[ReadRange] = []
    start = 0
    for sub in [*skewed, len(sizes)]:
        if sub > start:  # the run of unskewed subpartitions before it, coalesced on its own
            out.extend(ReadRange(start + s, start + e) for s, e in coalesce(sizes[start:sub], target))
        if sub == len(sizes):
            break
        parts = max(1, min(producers, math.ceil(sizes[sub] / piece)))
        bounds = [round(i * producers / parts) for i in range(parts + 1)]
        out.extend(ReadRange(sub, sub + 1, (a, b)) for a, b in zip(bounds, bounds[1:]) if b > a)
        start = sub + 1
    return out


def key_grouped(desc: ExchangeDescription) -> bool:
    """Whether read partitions must hold whole buckets of ``repartition(m, keys)``: a hash exchange whose
    width was given (a coalesced one promises only that each key is in one read partition)."""
    return desc.partitioner.name is Partitioner.HASH and not desc.coalesce


def slots_width(n: int, slots: int, grouped: bool) -> int:
    """Read partitions of a read laid out to ``slots`` task slots: min(slots, n), for a key-grouped read the
    largest divisor of n within that."""
    m = max(1, min(n, slots))
    while grouped and n % m:
        m -= 1
    return m


def requested_width(desc: ExchangeDescription, requested: str) -> int | None:
    """The read partitions ``readPartitions`` asks for, None for auto; a ConfigError naming the option and the
    values allowed for a bad one (the JVM reader's words)."""
    value = str(requested).strip().lower()
    if value == AUTO:
        return None
    name, n = desc.name, desc.num_subpartitions
    try:
        m = int(value)
    except ValueError:
        raise ConfigError(f"{READ_PARTITIONS} of exchange '{name}' must be {AUTO} or a number of read partitions, "
                          f"got '{requested}'") from None
    if n is None:
        raise ConfigError(f"{READ_PARTITIONS}={m} for exchange '{name}', whose width is not known until its write "
                          f"commits (written without numSubpartitions): give {AUTO}, or numSubpartitions to the write")
    if desc.partitioner.name is Partitioner.BROADCAST:
        if not 1 <= m <= n:
            raise ConfigError(f"{READ_PARTITIONS}={m} for broadcast exchange '{name}' of {n} copies: give a number "
                              f"from 1 to {n} (each read partition reads one copy)")
        return m
    grouped = key_grouped(desc)
    if m < 1 or m > n or (grouped and n % m):
        raise ConfigError(f"{READ_PARTITIONS}={m} for exchange '{name}' of {n} subpartitions: give "
                          + (f"a divisor of {n} (each read partition then holds whole buckets)" if grouped
                             else f"a number from 1 to {n}"))
    return m


def strided(n: int, m: int) -> list[ReadRange]:
    """m read partitions of n subpartitions: partition j reads j, j + m, ... (one range each when m == n)."""
    if m == n:
        return [ReadRange(j, j + 1) for j in range(n)]
    return [ReadRange(j, n, stride=m) for j in range(m)]


def read_ranges(desc: ExchangeDescription, advisory_size: int, skew: SkewRule | None = None,
                slots: int | None = None, requested: str = AUTO) -> list[ReadRange]:
    """The read partitions of an exchange description.

    ``requested`` (``readPartitions``) a number m: m strided read partitions (see the module's docstring), sealed
    or not; a broadcast's first m copies. Otherwise, an exchange still being written is laid out to ``slots``
    (the reading application's task slots; None: one read partition per subpartition), a broadcast one read
    partition per copy. Sealed: coalesced when the width was not given (``coalesce``) and every committed
    producer reported its sizes; otherwise one read partition per subpartition, since an explicit
    ``numSubpartitions`` promises ``spark_partition_id() == subpartition``. ``skew``: split skewed
    subpartitions of a coalesced read (see the module's docstring).
    """
    broadcast = desc.partitioner.name is Partitioner.BROADCAST
    m = requested_width(desc, requested)
    n = desc.num_subpartitions or 0
    if m is not None:
        return [ReadRange(j, j + 1) for j in range(m)] if broadcast else strided(n, m)
    if not desc.sealed and slots is not None and n and not broadcast:
        return strided(n, slots_width(n, slots, key_grouped(desc)))
    sizes = desc.layout_bytes  # what each subpartition decodes to: a compressed exchange's stored bytes are fewer
    if desc.coalesce and desc.sealed and sizes is not None and len(sizes) == n:
        producers = len(set(desc.committed))
        return plan_ranges(sizes, advisory_size, producers, skew if producers > 1 else None)
    return [ReadRange(i, i + 1) for i in range(n)]


def compact_producers(producers: list[dict]) -> list[dict]:
    """The producers as read tasks need them: only the fields a gate reads, and one location object per
    service (pickle then writes each location once). Spark unpickles the reader in every read task: a
    200-producer plan went from 66 KB and 4 ms per task to a fraction of that."""
    locations: dict[tuple, dict] = {}
    out = []
    for producer in producers:
        entry = {k: producer[k] for k in GATE_FIELDS if k in producer and (k != "replicas" or producer[k])}
        location = entry.get("location")
        if isinstance(location, dict):
            key = tuple(sorted((k, repr(v)) for k, v in location.items()))
            entry["location"] = locations.setdefault(key, location)
        out.append(entry)
    return out
