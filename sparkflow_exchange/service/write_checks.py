"""What a write must hold before the coordinator takes it: sizes and rows its producers report, the width,
and a commit that names every task that wrote rows. Plain functions over an :class:`~.exchanges.Exchange`;
the coordinator's writer role calls them before anything changes.
"""
from __future__ import annotations

from ..errors import ErrorCode, ServiceError
from ..kinds import PartitionState
from .exchanges import Exchange, ProducerInfo


def record_sizes(ex: Exchange, p: ProducerInfo, subpartition_bytes: list[int] | None, rows: int | None,
                 nbytes: int | None, subpartition_rows: list[int] | None,
                 subpartition_raw_bytes: list[int] | None = None) -> None:
    """Keep what a finished producer reports: its rows and bytes, and per subpartition its bytes (for coalesced
    reads), the same as they would be uncompressed (when some were compressed) and rows (summed at commit for
    readers that plan by rows)."""
    partition = p.partition
    if rows is not None:
        p.rows = rows
    if nbytes is not None:
        p.bytes = nbytes
    if subpartition_bytes is not None:
        sizes = _per_subpartition(subpartition_bytes, partition, "sizes")
        # a forward/broadcast producer has one subpartition of its own: its sizes do not add up per
        # subpartition, so it reports none (the commit then knows the sizes are incomplete)
        if ex.num_subpartitions is not None and len(sizes) == ex.num_subpartitions:
            ex.sizes[partition] = sizes
    for values, held, what in ((subpartition_raw_bytes, ex.raw_sizes, "raw sizes"),
                               (subpartition_rows, ex.row_counts, "rows")):
        if values is not None and ex.num_subpartitions is not None and len(values) == ex.num_subpartitions:
            held[partition] = _per_subpartition(values, partition, what)


def _per_subpartition(values: list[int], partition: str, what: str):
    """A producer's per-subpartition counts, checked (one dimension, none negative) and held until the commit in the
    narrowest type that fits (2,000 x 2,000 would be 32 MB as int64)."""
    import numpy as np

    counts = np.asarray(values, dtype=np.int64)
    if counts.ndim != 1 or (counts.size and counts.min() < 0):
        raise ServiceError(f"producer {partition} reported malformed subpartition {what}", ErrorCode.BAD_REQUEST)
    return counts.astype(np.uint32) if not counts.size or counts.max() < 1 << 32 else counts


def _raw_ratio(p: ProducerInfo | None) -> float:
    """How many bytes a producer's stored byte decodes to (1.0 when it did not report both counts)."""
    return p.raw_bytes / p.bytes if p is not None and p.bytes > 0 and p.raw_bytes >= p.bytes else 1.0


def fix_width(ex: Exchange, width: int) -> None:
    """The width a producer writes fixes an exchange declared without one; another width is refused."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ServiceError(f"numSubpartitions must be a positive integer, got {width!r}", ErrorCode.BAD_REQUEST)
    if ex.num_subpartitions is None:
        if not ex.coalesce:
            raise ServiceError(f"exchange {ex.name!r} has no width to fix: it was declared with numSubpartitions "
                           "or as forward/broadcast", ErrorCode.BAD_REQUEST)
        ex.num_subpartitions = width
    elif ex.num_subpartitions != width:
        raise ServiceError(
            f"exchange {ex.name!r} has {ex.num_subpartitions} subpartitions (fixed by its first producer, from "
            f"spark.sql.shuffle.partitions of the writing session), but this producer writes {width}: every "
            "write of one exchange needs the same spark.sql.shuffle.partitions, or set numSubpartitions",
            ErrorCode.WIDTH_MISMATCH)


def check_rows(ex: Exchange, partitions: list[str], rows: dict[str, int] | None) -> None:
    """Every committed producer pushed the rows its task says it wrote (when both are known)."""
    rows = rows or {}
    wrong = [(p, rows[p], ex.producers[p].rows) for p in partitions
             if isinstance(rows.get(p), int) and ex.producers[p].rows >= 0 and rows[p] != ex.producers[p].rows]
    if wrong:
        listed = ", ".join(f"producer {ex.producers[p].index} (partition {p}): task wrote {w} rows, pushed {g}"
                           for p, w, g in wrong[:5])
        raise ServiceError(f"commit of exchange {ex.name!r} refused: rows lost ({listed})", ErrorCode.ROWS_LOST)
    reported = [ex.producers[p].rows for p in partitions]
    if ex.committed_rows is not None:
        ex.committed_rows = None if any(r < 0 for r in reported) else ex.committed_rows + sum(reported)

def check_tasks_covered(ex: Exchange, of_write: list[ProducerInfo], winners: set[str]) -> None:
    """A commit holds every task that wrote rows: a task whose finished producers pushed rows but none of whose
    attempts the commit names means the driver lost its commit message (never an empty commit of a full write)."""
    covered = {p.index for p in of_write if p.partition in winners}
    uncovered: dict[int, int] = {}
    for p in of_write:
        if p.index not in covered and p.state == PartitionState.FINISHED and p.rows > 0:
            uncovered[p.index] = max(uncovered.get(p.index, 0), p.rows)
    if uncovered:
        listed = ", ".join(f"task {i} ({n} rows)" for i, n in sorted(uncovered.items())[:5])
        raise ServiceError(
            f"commit of exchange {ex.name!r} refused: it names {len(winners)} partitions, but {len(uncovered)} "
            f"tasks of this write pushed rows and none of their attempts is committed ({listed}); the writing "
            "driver lost their commit messages", ErrorCode.ROWS_LOST)

def add_sizes(ex: Exchange, partitions: list[str]) -> None:
    """Sum the winners' per-subpartition bytes into the exchange's one array (readers get only that), and the same
    bytes as they would be uncompressed (each producer's reported raw sizes; else its bytes scaled by its reported
    raw / stored ratio)."""
    import numpy as np

    if ex.num_subpartitions is None or not partitions:
        return
    total = ex.committed_bytes if ex.committed_bytes is not None else np.zeros(ex.num_subpartitions, np.int64)
    reported = [ex.sizes.pop(p) for p in partitions if p in ex.sizes]
    raw_reported = {p: ex.raw_sizes.pop(p) for p in partitions if p in ex.raw_sizes}
    counted = [ex.row_counts.pop(p) for p in partitions if p in ex.row_counts]
    if len(reported) < len(partitions) or any(len(r) != ex.num_subpartitions for r in reported):
        ex.sizes_complete = False  # e.g. forward: one subpartition per producer
        return
    # a journal written before raw sizes were kept has none for what it committed: those count as stored
    raw = (ex.committed_raw_bytes if ex.committed_raw_bytes is not None else total).copy()
    total = total.copy()
    for partition, sizes in zip(partitions, reported):  # one at a time: stacking would copy every producer's array
        total += sizes
        exact = raw_reported.get(partition)
        raw += exact if exact is not None else np.rint(sizes * _raw_ratio(ex.producers.get(partition))).astype(np.int64)
    ex.committed_bytes = total
    ex.committed_raw_bytes = raw
    if len(counted) < len(partitions) or (ex.commits and ex.committed_sub_rows is None):
        ex.committed_sub_rows = None  # a producer that did not count its rows (an older client)
        return
    rows = ex.committed_sub_rows.copy() if ex.committed_sub_rows is not None else np.zeros(ex.num_subpartitions, np.int64)
    for counts in counted:
        rows += counts
    ex.committed_sub_rows = rows
