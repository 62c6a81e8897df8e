"""Channel selectors and split_by_target, no Spark needed."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from sparkflow_exchange.kinds import Partitioner
from sparkflow_exchange.writer.selectors import (
    ChannelSelector,
    SelectorError,
    make_selector,
    split_by_target,
)
from sparkflow_exchange.writer.spark_hash import spark_partition_ids

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("m", pa.map_(pa.int32(), pa.int32()))])


def batch(rows: int, start: int = 0) -> pa.RecordBatch:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.record_batch(
        [
            pa.array(ids),
            pa.array([f"row-{i}" for i in ids]),
            pa.array([[(int(i % 3), 1)] for i in ids], SCHEMA.field("m").type),
        ],
        schema=SCHEMA,
    )


def selector(partitioner: str, n: int, producer: int = 0, **kw) -> ChannelSelector:
    return make_selector(partitioner, n, producer, SCHEMA, **kw)


# -- hash --------------------------------------------------------------------


def test_hash_places_like_spark_partition_ids():
    sel = selector("HASH", 5, keys=["id", "name"])
    b = batch(1000)
    assert isinstance(sel, ChannelSelector) and not sel.is_broadcast
    targets = sel.select(b)
    assert targets.dtype == np.int32 and len(targets) == 1000
    np.testing.assert_array_equal(targets, spark_partition_ids(b, ["id", "name"], 5))
    assert set(targets.tolist()) == set(range(5))


def test_hash_needs_keys():
    with pytest.raises(SelectorError, match="hash partitioner needs the 'keys' option"):
        selector("hash", 4)


def test_hash_missing_key_names_it_and_the_columns():
    with pytest.raises(SelectorError) as info:
        selector("hash", 4, keys=["id", "nmae"])
    msg = str(info.value)
    assert "'nmae'" in msg and "id, name, m" in msg


def test_hash_key_of_unhashable_type_fails_early():
    with pytest.raises(SelectorError, match="'m'.*map"):
        selector("hash", 4, keys=["m"])


# -- broadcast / forward -----------------------------------------------------


def test_broadcast_is_flagged_and_refuses_per_row_selection():
    sel = selector("Broadcast", 3)
    assert sel.is_broadcast is True
    with pytest.raises(SelectorError, match="every subpartition"):
        sel.select(batch(2))


def test_forward_sends_everything_to_its_own_subpartition():
    sel = selector("forward", 4, producer=2)
    assert not sel.is_broadcast
    assert sel.select(batch(5)).tolist() == [2] * 5
    assert sel.select(batch(0)).tolist() == []


def test_forward_needs_equal_parallelism():
    with pytest.raises(SelectorError) as info:
        selector("forward", 3, producer=3)
    msg = str(info.value)
    assert "equal parallelism" in msg and "3" in msg and "producer index 3" in msg and "3 subpartitions" in msg
    with pytest.raises(SelectorError, match="equal parallelism: 4 producers but 3 subpartitions"):
        selector("forward", 3, producer=0, num_producers=4)


# -- rebalance / rescale -----------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 8])
def test_rebalance_is_even_per_producer_and_continues_across_batches(n):
    for producer in range(5):
        sel = selector("rebalance", n, producer=producer)
        counts = np.zeros(n, dtype=np.int64)
        first = None
        for size in (1, 7, 0, 13, 100, 3):
            targets = sel.select(batch(size))
            assert targets.dtype == np.int32
            if first is None and size:
                first = int(targets[0])
            counts += np.bincount(targets, minlength=n)
            assert counts.max() - counts.min() <= 1  # even after every batch
        assert first == producer % n


def test_rebalance_round_robin_order():
    sel = selector("rebalance", 3, producer=1)
    assert sel.select(batch(4)).tolist() == [1, 2, 0, 1]
    assert sel.select(batch(2)).tolist() == [2, 0]


@pytest.mark.parametrize("n, producers", [(8, 4), (7, 3), (6, 6), (3, 7), (2, 5)])
def test_rescale_uses_contiguous_ranges_that_cover_everything(n, producers):
    seen: list[set[int]] = []
    for p in range(producers):
        sel = selector("rescale", n, producer=p, num_producers=producers)
        targets = np.concatenate([sel.select(batch(s)) for s in (5, 11, 1)])
        used = set(targets.tolist())
        assert used == set(range(min(used), max(used) + 1))  # contiguous
        if n >= producers:
            lo, hi = p * n // producers, (p + 1) * n // producers
            assert used == set(range(lo, hi))
            counts = np.bincount(targets - lo, minlength=hi - lo)
            assert counts.max() - counts.min() <= 1
        else:
            assert used == {p * n // producers}
        seen.append(used)
    assert set().union(*seen) == set(range(n))
    if n >= producers:  # ranges are disjoint
        assert sum(len(s) for s in seen) == n


def test_rescale_without_num_producers_is_one_to_one_and_wraps():
    assert set(selector("rescale", 4, producer=1).select(batch(9)).tolist()) == {1}
    assert set(selector("rescale", 4, producer=6).select(batch(9)).tolist()) == {2}


# -- custom ------------------------------------------------------------------


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    name = "sparkflow_test_custom_partitioners"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc

            def by_id(batch, n):
                return batch.column("id").to_numpy() % n

            def as_arrow(batch, n):
                return pc.cast(pc.divide(batch.column("id"), 1), pa.int8())

            def too_short(batch, n):
                return np.zeros(max(batch.num_rows - 1, 0), dtype=np.int64)

            def out_of_range(batch, n):
                return np.full(batch.num_rows, n, dtype=np.int64)

            def negative(batch, n):
                return np.full(batch.num_rows, -1, dtype=np.int64)

            def floats(batch, n):
                return np.zeros(batch.num_rows, dtype=np.float64)

            def booleans(batch, n):
                return np.zeros(batch.num_rows, dtype=bool)

            def boom(batch, n):
                raise RuntimeError("kaput")

            class Holder:
                @staticmethod
                def first(batch, n):
                    return np.zeros(batch.num_rows, dtype=np.uint8)

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_custom_function_routes_rows(custom_module):
    sel = selector("CUSTOM", 4, custom=f"{custom_module}:by_id")
    assert not sel.is_broadcast
    targets = sel.select(batch(10))
    assert targets.dtype == np.int32 and targets.tolist() == [i % 4 for i in range(10)]
    arrow_sel = selector("custom", 10, custom=f"{custom_module}:as_arrow")
    assert arrow_sel.select(batch(3, start=2)).tolist() == [2, 3, 4]
    dotted = selector("custom", 2, custom=f"{custom_module}:Holder.first")
    assert dotted.select(batch(3)).tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    "func, pattern",
    [
        ("too_short", "returned 9 indices for a batch of 10 rows"),
        ("out_of_range", r"returned index 4; valid subpartitions are 0\.\.3"),
        ("negative", "returned index -1"),
        ("floats", "1-D integer array.*float64"),
        ("booleans", "1-D integer array.*bool"),
        ("boom", "failed: RuntimeError\\('kaput'\\)"),
    ],
)
def test_custom_output_is_validated(custom_module, func, pattern):
    sel = selector("custom", 4, custom=f"{custom_module}:{func}")
    with pytest.raises(SelectorError, match=pattern):
        sel.select(batch(10))


@pytest.mark.parametrize(
    "spec, pattern",
    [
        (None, "needs the 'custom' option"),
        ("no_colon_here", "must be given as 'module:function'"),
        ("sparkflow_no_such_module_xyz:f", "cannot import module 'sparkflow_no_such_module_xyz'"),
        ("{mod}:missing", "has no attribute 'missing'"),
        ("{mod}:NOT_CALLABLE", "is not callable"),
    ],
)
def test_custom_spec_errors(custom_module, spec, pattern):
    with pytest.raises(SelectorError, match=pattern):
        selector("custom", 4, custom=None if spec is None else spec.format(mod=custom_module))


# -- general validation ------------------------------------------------------


def test_unknown_partitioner_lists_known_ones():
    with pytest.raises(SelectorError) as info:
        selector("shuffle", 4)
    msg = str(info.value)
    assert "'shuffle'" in msg and all(p.value in msg for p in Partitioner)


@pytest.mark.parametrize("n", [0, -1])
def test_bad_subpartition_count(n):
    with pytest.raises(SelectorError, match="positive integer"):
        selector("rebalance", n)


def test_selector_error_is_a_value_error():
    assert issubclass(SelectorError, ValueError)


# -- split_by_target ---------------------------------------------------------


def test_split_keeps_order_and_loses_nothing():
    rng = np.random.default_rng(3)
    b = batch(5000)
    n = 7
    targets = rng.integers(0, n - 1, size=b.num_rows).astype(np.int32)  # n-1 stays empty
    parts = split_by_target(b, targets, n)
    assert len(parts) == n and parts[n - 1] is None
    all_ids = []
    for i, part in enumerate(parts[:-1]):
        assert part is not None and part.schema == b.schema
        ids = part.column("id").to_numpy()
        np.testing.assert_array_equal(ids, np.flatnonzero(targets == i))  # original order
        assert part.column("name").to_pylist() == [f"row-{j}" for j in ids]
        all_ids.append(ids)
    merged = np.sort(np.concatenate(all_ids))
    np.testing.assert_array_equal(merged, np.arange(b.num_rows))


def test_split_single_target_and_empty_batch():
    b = batch(4)
    parts = split_by_target(b, np.full(4, 2, dtype=np.int32), 3)
    assert parts[0] is None and parts[1] is None and parts[2] is b
    assert split_by_target(batch(0), np.zeros(0, dtype=np.int32), 3) == [None, None, None]


def test_split_validates_targets():
    b = batch(3)
    with pytest.raises(SelectorError, match="2 targets for a batch of 3 rows"):
        split_by_target(b, np.zeros(2, dtype=np.int32), 3)
    with pytest.raises(SelectorError, match="out of range"):
        split_by_target(b, np.array([0, 3, 1], dtype=np.int32), 3)
    with pytest.raises(SelectorError, match="out of range"):
        split_by_target(b, np.array([0, -1, 1], dtype=np.int32), 3)


def test_split_with_hash_selector_matches_targets():
    b = batch(300)
    sel = selector("hash", 8, keys=["name"])
    targets = sel.select(b)
    for i, part in enumerate(split_by_target(b, targets, 8)):
        expected = np.flatnonzero(targets == i)
        got = [] if part is None else part.column("id").to_numpy().tolist()
        assert got == expected.tolist()
