"""Read partitions of an exchange: one per subpartition, or adjacent subpartitions coalesced (Spark's AQE).

A Python read task costs Spark about 35 ms whatever it reads, so 200 read
tasks of tiny subpartitions cannot be fast. When the writer did not give
``numSubpartitions`` (the width is the session's ``spark.sql.shuffle.partitions``)
and the exchange is sealed, the reader groups adjacent subpartitions into read
partitions of about ``advisoryPartitionSize`` bytes, as Spark's
``ShufflePartitionsUtil.coalescePartitions`` does for ``repartition(col)``:
whole subpartitions are grouped, so every key stays in one read partition.
"""
from __future__ import annotations

from typing import Sequence

# what an input gate reads of a producer; the rest of the coordinator's entry stays on the driver
GATE_FIELDS = ("index", "partition", "state", "reason", "spill", "location")

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


def read_ranges(desc: dict, advisory_size: int) -> list[tuple[int, int]]:
    """The read partitions of an exchange description, as subpartition ranges.

    Coalesced only when the width was not given (``coalesce``), the exchange is sealed and every committed
    producer reported its sizes; otherwise one read partition per subpartition: an explicit
    ``numSubpartitions`` promises ``spark_partition_id() == subpartition``, and an exchange still being written
    has no final sizes (a read that starts while it is written cannot wait for them).
    """
    n = desc.get("num_subpartitions") or 0
    sizes = desc.get("subpartition_bytes")
    if desc.get("coalesce") and desc.get("sealed") and sizes is not None and len(sizes) == n:
        return coalesce(sizes, advisory_size)
    return [(i, i + 1) for i in range(n)]


def compact_producers(producers: list[dict]) -> list[dict]:
    """The producers as read tasks need them: only the fields a gate reads, and one location object per
    service (pickle then writes each location once). Spark unpickles the reader in every read task: a
    200-producer plan went from 66 KB and 4 ms per task to a fraction of that."""
    locations: dict[tuple, dict] = {}
    out = []
    for producer in producers:
        entry = {k: producer[k] for k in GATE_FIELDS if k in producer}
        location = entry.get("location")
        if isinstance(location, dict):
            key = tuple(sorted((k, repr(v)) for k, v in location.items()))
            entry["location"] = locations.setdefault(key, location)
        out.append(entry)
    return out
