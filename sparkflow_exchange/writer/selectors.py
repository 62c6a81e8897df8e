"""Channel selectors: which subpartition each row of a batch goes to.

Flink's ChannelSelector picks a channel per record; here a selector returns
the target of every row of an Arrow batch at once (an int32 array), and
:func:`split_by_target` cuts the batch into one slice per subpartition, so no
Python code runs per row.

Partitioners (names are case-insensitive):

``hash``
    ``pmod(murmur3(keys, 42), n)``, exactly Spark's ``repartition(n, *keys)``.
``broadcast``
    every row to every subpartition; ``is_broadcast`` is set and the writer
    serialises the batch once instead of calling ``select``.
``forward``
    producer *i* to subpartition *i*; needs as many producers as
    subpartitions.
``rebalance``
    round robin over all subpartitions, each producer starting at
    ``producer_index % n`` and continuing across batches, so producers do
    not all pile onto subpartition 0 with their first rows.
``rescale``
    producer *i* to a contiguous range of subpartitions (Flink's POINTWISE
    pattern: a local, cheaper fan-out than rebalance). With ``P`` producers
    and ``n >= P``, producer *i* round-robins over
    ``[i*n//P, (i+1)*n//P)``; with ``n < P`` it sends everything to
    ``i*n//P``. When ``num_producers`` is unknown we assume ``P == n``
    (producer *i* to subpartition *i*) and wrap producers beyond ``n`` to
    ``i % n``; pass ``num_producers`` for the real fan-out.
``custom``
    ``custom="module:function"`` (attributes may be dotted), called as
    ``function(batch, num_subpartitions)`` and returning one integer index
    per row; the result is validated because a bad index would otherwise
    lose rows or fail far away in the network layer.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from ..arrow_numpy import empty_batch, indices
from ..kinds import Partitioner
from .spark_hash import check_hashable, spark_partition_ids

__all__ = [
    "ChannelSelector",
    "SelectorError",
    "make_selector",
    "split_by_target",
    "group_by_target",
    "HashSelector",
    "BroadcastSelector",
    "ForwardSelector",
    "RebalanceSelector",
    "RescaleSelector",
    "CustomSelector",
]

class SelectorError(ValueError):
    """A partitioner that cannot work with the given options, schema or data."""


@runtime_checkable
class ChannelSelector(Protocol):
    """Routes the rows of a batch to subpartitions."""

    is_broadcast: bool

    def select(self, batch: pa.RecordBatch) -> np.ndarray:
        """int32 subpartition index per row (not called when is_broadcast)."""
        ...


class HashSelector:
    """Spark-compatible placement, so subpartition i holds Spark's partition i."""

    is_broadcast = False

    def __init__(self, keys: Sequence[str], num_subpartitions: int) -> None:
        self.keys = tuple(keys)
        self.n = num_subpartitions

    def select(self, batch: pa.RecordBatch) -> np.ndarray:
        return spark_partition_ids(batch, self.keys, self.n)


class BroadcastSelector:
    """Every row everywhere; the writer copies the batch, not the selector."""

    is_broadcast = True

    def __init__(self, num_subpartitions: int) -> None:
        self.n = num_subpartitions

    def select(self, batch: pa.RecordBatch) -> np.ndarray:
        raise SelectorError(
            "the broadcast partitioner has no per-row target: write the batch to every subpartition"
        )


class _ConstantSelector:
    is_broadcast = False

    def __init__(self, target: int) -> None:
        self.target = target

    def select(self, batch: pa.RecordBatch) -> np.ndarray:
        return np.full(batch.num_rows, self.target, dtype=np.int32)


class ForwardSelector(_ConstantSelector):
    """Producer i feeds consumer i only (a local, one-to-one exchange)."""


class _RoundRobin:
    """Cycles over ``width`` subpartitions from ``base``, remembering its position."""

    is_broadcast = False

    def __init__(self, base: int, width: int, start: int) -> None:
        self.base = base
        self.width = width
        self.next = start % width

    def select(self, batch: pa.RecordBatch) -> np.ndarray:
        rows = batch.num_rows
        targets = np.arange(self.next, self.next + rows, dtype=np.int64)
        targets %= self.width
        targets += self.base
        self.next = (self.next + rows) % self.width
        return targets.astype(np.int32)


class RebalanceSelector(_RoundRobin):
    """Even spread regardless of keys; offsets differ per producer."""

    def __init__(self, num_subpartitions: int, producer_index: int) -> None:
        super().__init__(0, num_subpartitions, producer_index % num_subpartitions)


class RescaleSelector(_RoundRobin):
    """Round robin over this producer's own contiguous range of subpartitions."""

    def __init__(self, num_subpartitions: int, producer_index: int, num_producers: int | None) -> None:
        n = num_subpartitions
        if num_producers is None:
            lo, hi = producer_index % n, producer_index % n + 1
        elif n >= num_producers:
            lo = producer_index * n // num_producers
            hi = (producer_index + 1) * n // num_producers
        else:
            lo = producer_index * n // num_producers
            hi = lo + 1
        self.range = (lo, hi)
        super().__init__(lo, hi - lo, 0)


class CustomSelector:
    """A user function; its output is checked before any row moves."""

    is_broadcast = False

    def __init__(self, spec: str, func: Callable[[pa.RecordBatch, int], object], num_subpartitions: int) -> None:
        self.spec = spec
        self.func = func
        self.n = num_subpartitions

    def select(self, batch: pa.RecordBatch) -> np.ndarray:
        try:
            result = self.func(batch, self.n)
        except Exception as exc:
            raise SelectorError(f"custom partitioner {self.spec} failed: {exc!r}") from exc
        if isinstance(result, (pa.Array, pa.ChunkedArray)):
            if not pa.types.is_integer(result.type):
                raise SelectorError(
                    f"custom partitioner {self.spec} returned an Arrow array of {result.type}; "
                    "expected integer subpartition indices"
                )
            if result.null_count:
                raise SelectorError(
                    f"custom partitioner {self.spec} returned {result.null_count} null indices"
                )
            result = result.to_numpy()
        targets = np.asarray(result)
        if targets.ndim != 1 or targets.dtype.kind not in "iu":
            raise SelectorError(
                f"custom partitioner {self.spec} must return a 1-D integer array, "
                f"got {targets.ndim}-D array of {targets.dtype}"
            )
        if len(targets) != batch.num_rows:
            raise SelectorError(
                f"custom partitioner {self.spec} returned {len(targets)} indices "
                f"for a batch of {batch.num_rows} rows"
            )
        if len(targets):
            lo, hi = int(targets.min()), int(targets.max())
            if lo < 0 or hi >= self.n:
                bad = lo if lo < 0 else hi
                raise SelectorError(
                    f"custom partitioner {self.spec} returned index {bad}; "
                    f"valid subpartitions are 0..{self.n - 1}"
                )
        return targets.astype(np.int32, copy=False)


def _load_custom(spec: str | None) -> Callable[[pa.RecordBatch, int], object]:
    if not spec:
        raise SelectorError("custom partitioner needs the 'custom' option as 'module:function'")
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise SelectorError(f"custom partitioner must be given as 'module:function', got {spec!r}")
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:
        raise SelectorError(f"custom partitioner {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise SelectorError(
                f"custom partitioner {spec!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if not callable(obj):
        raise SelectorError(f"custom partitioner {spec!r} is not callable")
    return obj  # type: ignore[return-value]


def make_selector(
    partitioner: Partitioner | str,
    num_subpartitions: int,
    producer_index: int,
    schema: pa.Schema,
    keys: Sequence[str] = (),
    num_producers: int | None = None,
    custom: str | None = None,
) -> ChannelSelector:
    """Build and validate a selector when the writer opens, not at the first batch.

    ``keys`` is only used by ``hash`` and ``custom`` only by ``custom``.
    """
    try:
        name = Partitioner.of(partitioner)
    except ValueError as exc:
        raise SelectorError(str(exc)) from None
    n = num_subpartitions
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise SelectorError(f"number of subpartitions must be a positive integer, got {n!r}")
    if producer_index < 0:
        raise SelectorError(f"producer index must be >= 0, got {producer_index}")
    if num_producers is not None:
        if num_producers < 1:
            raise SelectorError(f"number of producers must be >= 1, got {num_producers}")
        if producer_index >= num_producers:
            raise SelectorError(
                f"producer index {producer_index} is out of range for {num_producers} producers"
            )

    if name.keyed:
        if isinstance(keys, str):
            keys = [keys]
        if not keys:
            raise SelectorError(f"{name} partitioner needs the 'keys' option")
        available = schema.names
        for key in keys:
            if key not in available:
                raise SelectorError(
                    f"hash key {key!r} is not a column; available columns: {', '.join(available)}"
                )
            try:
                check_hashable(schema.field(key).type)
            except TypeError as exc:
                raise SelectorError(f"hash key {key!r}: {exc}") from exc
        return HashSelector(keys, n)
    if name is Partitioner.BROADCAST:
        return BroadcastSelector(n)
    if name is Partitioner.FORWARD:
        if producer_index >= n:
            raise SelectorError(
                "forward partitioner needs equal parallelism: producer index "
                f"{producer_index} but only {n} subpartitions"
            )
        if num_producers is not None and num_producers != n:
            raise SelectorError(
                f"forward partitioner needs equal parallelism: {num_producers} producers "
                f"but {n} subpartitions"
            )
        return ForwardSelector(producer_index)
    if name is Partitioner.REBALANCE:
        return RebalanceSelector(n, producer_index)
    if name is Partitioner.RESCALE:
        return RescaleSelector(n, producer_index, num_producers)
    return CustomSelector(str(custom), _load_custom(custom), n)


def split_by_target(batch: pa.RecordBatch, targets: np.ndarray, n: int) -> list[pa.RecordBatch | None]:
    """One slice per subpartition, rows in their original order within each.

    A stable sort by target plus one ``take`` gathers each subpartition's
    rows contiguously; the slices are then zero-copy views of that result.
    """
    targets = np.asarray(targets)
    if len(targets) != batch.num_rows:
        raise SelectorError(f"{len(targets)} targets for a batch of {batch.num_rows} rows")
    out: list[pa.RecordBatch | None] = [None] * n
    if batch.num_rows == 0:
        return out
    lo, hi = int(targets.min()), int(targets.max())
    if lo < 0 or hi >= n:
        raise SelectorError(f"target {lo if lo < 0 else hi} out of range 0..{n - 1}")
    if lo == hi:  # the whole batch goes to one place: no copy
        out[lo] = batch
        return out
    # uint16 keys let NumPy use its O(n) radix sort, which is stable.
    sort_keys = targets.astype(np.uint16 if n <= 1 << 16 else np.int64, copy=False)
    order = np.argsort(sort_keys, kind="stable")
    counts = np.bincount(targets.astype(np.intp, copy=False), minlength=n)
    gathered = batch.take(indices(order))
    start = 0
    for i, count in enumerate(counts.tolist()):
        if count:
            out[i] = gathered.slice(start, count)
            start += count
    return out


def group_by_target(batches: Sequence[pa.RecordBatch], targets: Sequence[np.ndarray],
                    n: int) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray, np.ndarray]:
    """Many batches' rows grouped by subpartition at once (the sort buffer's flush, FLIP-148).

    Returns the grouped rows as one batch and, for every subpartition that got
    rows, its index, first row and row count (ascending subpartition). One
    stable sort and one ``take`` over the whole buffer: per flush the writer
    touches each subpartition once, not once per incoming batch. Rows keep
    their arrival order within a subpartition.
    """
    if len(batches) != len(targets):
        raise SelectorError(f"{len(targets)} target arrays for {len(batches)} batches")
    for batch, t in zip(batches, targets):
        if len(t) != batch.num_rows:
            raise SelectorError(f"{len(t)} targets for a batch of {batch.num_rows} rows")
    empty = np.zeros(0, np.int64)
    all_targets = np.concatenate([np.asarray(t) for t in targets]) if targets else empty
    if len(all_targets) == 0:
        schema = batches[0].schema if batches else pa.schema([])
        return empty_batch(schema), empty, empty, empty
    lo, hi = int(all_targets.min()), int(all_targets.max())
    if lo < 0 or hi >= n:
        raise SelectorError(f"target {lo if lo < 0 else hi} out of range 0..{n - 1}")
    rows = len(all_targets)
    if lo == hi:  # everything to one subpartition: no sort, no take
        grouped = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        return grouped, np.array([lo]), np.array([0]), np.array([rows])
    # uint16 keys let NumPy use its O(n) radix sort, which is stable.
    order = np.argsort(all_targets.astype(np.uint16 if n <= 1 << 16 else np.int64, copy=False), kind="stable")
    counts = np.bincount(all_targets.astype(np.intp, copy=False), minlength=n)
    taken = pa.Table.from_batches(batches).take(indices(order)).to_batches()
    grouped = taken[0] if len(taken) == 1 else pa.concat_batches(taken)
    subs = np.flatnonzero(counts)
    sub_counts = counts[subs]
    starts = np.concatenate(([0], np.cumsum(sub_counts)[:-1]))
    return grouped, subs, starts, sub_counts
