"""spark_hash / spark_partition_ids checked row by row against a live Spark.

Spark is the specification: every generated row must get the same
``hash(...)`` as ``F.hash`` and the same partition as ``spark_partition_id()``
after ``repartition(n, *keys)``. The Spark part runs a handful of queries on
one few-thousand-row DataFrame to stay fast.
"""
from __future__ import annotations

import decimal
import random

import numpy as np
import pyarrow as pa
import pytest

import sparkflow_exchange.writer.spark_hash as sh
from sparkflow_exchange.writer.spark_hash import spark_hash, spark_partition_ids

N_ROWS = 3000
CHARS = list("abcXYZ019 _-") + ["é", "ß", "ж", "中", "€", "😀", "𝄞"]


def _with_nulls(rng: random.Random, values: list, p: float = 0.1) -> list:
    return [None if rng.random() < p else v for v in values]


def _decimal(rng: random.Random, precision: int, scale: int) -> decimal.Decimal:
    edge = 10**precision - 1
    pick = rng.random()
    if pick < 0.05:
        unscaled = rng.choice([edge, -edge, 0, -1, 1])
    elif pick < 0.25:
        # Around byte boundaries of the two's complement encoding.
        bits = rng.randrange(0, min(precision * 10 // 3, 126))
        unscaled = rng.choice([-1, 1]) * (2**bits) + rng.choice([-1, 0, 1])
        unscaled = max(-edge, min(edge, unscaled))
    else:
        digits = rng.randrange(1, precision + 1)
        unscaled = rng.randrange(10**digits) * rng.choice([-1, 1])
    return decimal.Decimal(unscaled).scaleb(-scale, context=decimal.Context(prec=60))


def _text(rng: random.Random, max_len: int = 20) -> str:
    n = rng.randrange(0, max_len + 1) if rng.random() < 0.97 else rng.randrange(21, 80)
    return "".join(rng.choice(CHARS) for _ in range(n))


def make_table(n: int = N_ROWS, seed: int = 7) -> pa.Table:
    """Keys of every supported type with nulls and the awkward values."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)

    def ints(bits: int) -> list:
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        vals = nrng.integers(lo, hi, size=n, endpoint=True).tolist()
        vals[:6] = [lo, hi, 0, -1, 1, lo + 1]
        small = nrng.integers(max(lo, -300), min(hi, 300), size=n // 4).tolist()  # collisions, negatives
        vals[6 : 6 + len(small)] = small
        return _with_nulls(rng, vals)

    f64 = nrng.normal(scale=1e6, size=n)
    f64[::7] = np.round(f64[::7])
    special = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-310, -1.5]
    f64[: len(special)] = special
    f64 = list(f64)
    f32 = np.array(f64, dtype=np.float32)
    # NaNs with non-canonical payloads must hash like the canonical NaN.
    f32_bits = f32.view(np.uint32)
    f32_bits[8] = 0x7FC00001
    f32_bits[9] = 0xFFC00000
    f64_arr = np.array(f64, dtype=np.float64)
    f64_bits = f64_arr.view(np.uint64)
    f64_bits[8] = 0x7FF8000000000001
    f64_bits[9] = 0xFFF8000000000000
    f64_mask = np.array([rng.random() < 0.1 for _ in range(n)])
    f64_mask[:10] = False

    ts_us = nrng.integers(-(2**55), 2**55, size=n)
    ts_us[:4] = [0, -1, 1, -86_400_000_000]

    def binary() -> bytes:
        return bytes(nrng.integers(0, 256, size=rng.randrange(0, 25), dtype=np.uint8))

    list_vals = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08:
            list_vals.append(None)
        elif r < 0.15:
            list_vals.append([])
        else:
            list_vals.append(
                _with_nulls(rng, [rng.randrange(-1000, 1000) for _ in range(rng.randrange(1, 7))], 0.2)
            )

    struct_vals = [
        None
        if rng.random() < 0.08
        else {
            "a": None if rng.random() < 0.1 else rng.randrange(-(2**40), 2**40),
            "b": None if rng.random() < 0.1 else _text(rng, 10),
            "c": None if rng.random() < 0.1 else rng.choice([0.0, -0.0, float("nan"), rng.random()]),
        }
        for _ in range(n)
    ]

    cols = {
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "b": pa.array(_with_nulls(rng, [rng.random() < 0.5 for _ in range(n)]), pa.bool_()),
        "i8": pa.array(ints(8), pa.int8()),
        "i16": pa.array(ints(16), pa.int16()),
        "i32": pa.array(ints(32), pa.int32()),
        "i64": pa.array(ints(64), pa.int64()),
        "f32": pa.array(f32, pa.float32(), mask=f64_mask),
        "f64": pa.array(f64_arr, pa.float64(), mask=f64_mask),
        "date": pa.array(_with_nulls(rng, nrng.integers(-800_000, 800_000, size=n).tolist()), pa.date32()),
        "ts": pa.array(
            _with_nulls(rng, ts_us.tolist()), pa.timestamp("us", tz="UTC")
        ),
        "ts_ny_ms": pa.array(
            _with_nulls(rng, (ts_us // 1000).tolist()), pa.timestamp("ms", tz="America/New_York")
        ),
        "d10_2": pa.array(_with_nulls(rng, [_decimal(rng, 10, 2) for _ in range(n)]), pa.decimal128(10, 2)),
        "d18": pa.array(_with_nulls(rng, [_decimal(rng, 18, 0) for _ in range(n)]), pa.decimal128(18, 0)),
        "d19_3": pa.array(_with_nulls(rng, [_decimal(rng, 19, 3) for _ in range(n)]), pa.decimal128(19, 3)),
        "d20": pa.array(_with_nulls(rng, [_decimal(rng, 20, 0) for _ in range(n)]), pa.decimal128(20, 0)),
        "d38_10": pa.array(_with_nulls(rng, [_decimal(rng, 38, 10) for _ in range(n)]), pa.decimal128(38, 10)),
        "s": pa.array(_with_nulls(rng, [_text(rng) for _ in range(n)]), pa.string()),
        "bin": pa.array(_with_nulls(rng, [binary() for _ in range(n)]), pa.binary()),
        "arr": pa.array(list_vals, pa.list_(pa.int32())),
        "arr_s": pa.array(
            [None if v is None else [None if x is None else _text(rng, 6) for x in v] for v in list_vals],
            pa.list_(pa.string()),
        ),
        "st": pa.array(
            struct_vals,
            pa.struct([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())]),
        ),
        "tm": pa.array(
            _with_nulls(rng, nrng.integers(0, 86_400_000_000, size=n).tolist()), pa.time64("us")
        ),
        "dur": pa.array(_with_nulls(rng, nrng.integers(-(2**50), 2**50, size=n).tolist()), pa.duration("us")),
    }
    return pa.table(cols)


KEY_COLUMNS = [
    "b", "i8", "i16", "i32", "i64", "f32", "f64", "date", "ts", "ts_ny_ms", "ts_ntz",
    "d10_2", "d18", "d19_3", "d20", "d38_10", "s", "bin", "arr", "arr_s", "st", "tm", "dur",
]  # fmt: skip
MULTI_KEYS = ["i32", "s", "d38_10", "ts", "f64", "b"]
REPARTITIONS = [
    (7, MULTI_KEYS),
    (8, MULTI_KEYS),
    (8, ["s"]),
    (7, ["i64", "d18", "d20", "date", "bin", "f32", "ts_ntz", "arr", "st"]),
]


def _assert_rows_equal(name: str, mine: np.ndarray, spark: np.ndarray, values: pa.Array) -> None:
    bad = np.flatnonzero(mine != spark)
    if len(bad):
        examples = [(int(i), values[int(i)].as_py(), int(mine[i]), int(spark[i])) for i in bad[:5]]
        pytest.fail(f"{name}: {len(bad)} of {len(mine)} rows differ, (row, value, ours, spark): {examples}")


@pytest.fixture(scope="module")
def spark_results(spark):
    """One DataFrame, one query for every hash, one per repartition."""
    from pyspark.sql import functions as F

    table = make_table()
    df = spark.createDataFrame(table).withColumn("ts_ntz", F.col("ts").cast("timestamp_ntz"))
    hashes = [F.hash(c).alias(f"h_{c}") for c in KEY_COLUMNS]
    hashes.append(F.hash(*MULTI_KEYS).alias("h_multi"))
    hashes.append(F.hash(*KEY_COLUMNS).alias("h_all"))
    result = df.select("*", *hashes).toArrow().sort_by("id")
    pids = {}
    for n, keys in REPARTITIONS:
        part = (
            df.repartition(n, *keys)
            .select("id", F.spark_partition_id().alias("pid"))
            .toArrow()
            .sort_by("id")
        )
        pids[(n, tuple(keys))] = part.column("pid").to_numpy()
    return table, result, pids


@pytest.mark.spark
@pytest.mark.parametrize("column", KEY_COLUMNS)
def test_single_column_hash_matches_spark(spark_results, column):
    table, result, _ = spark_results
    expected = result.column(f"h_{column}").to_numpy()
    # The batch Spark hands to a writer (session-zone labels, Spark's types).
    _assert_rows_equal(column, spark_hash([result.column(column)]), expected, result.column(column))
    if column in table.column_names:  # and the Arrow data it was created from
        _assert_rows_equal(
            f"{column} (input)", spark_hash([table.column(column)]), expected, table.column(column)
        )


@pytest.mark.spark
def test_multi_column_hash_folds_like_spark(spark_results):
    _, result, _ = spark_results
    for name, keys in (("multi", MULTI_KEYS), ("all", KEY_COLUMNS)):
        mine = spark_hash([result.column(k) for k in keys])
        _assert_rows_equal(name, mine, result.column(f"h_{name}").to_numpy(), result.column("id"))


@pytest.mark.spark
@pytest.mark.parametrize("n, keys", REPARTITIONS, ids=lambda v: str(v) if isinstance(v, int) else "+".join(v))
def test_partition_ids_match_repartition(spark_results, n, keys):
    _, result, pids = spark_results
    for batch in result.to_batches(max_chunksize=700):  # as a writer sees it
        ids = batch.column("id").to_numpy()
        mine = spark_partition_ids(batch, keys, n)
        assert mine.dtype == np.int32
        assert mine.min() >= 0 and mine.max() < n
        _assert_rows_equal(f"pid {n} {keys}", mine, pids[(n, tuple(keys))][ids], batch.column("id"))


@pytest.mark.spark
def test_chunked_and_sliced_inputs_match(spark_results, monkeypatch):
    """Row chunking, Arrow slices and chunk boundaries must not change a hash."""
    _, result, _ = spark_results
    keys = ["i64", "s", "d38_10", "arr", "b", "st"]
    expected = spark_hash([result.column(k) for k in keys])
    monkeypatch.setattr(sh, "_CHUNK_ROWS", 333)
    rechunked = [pa.chunked_array([c.slice(0, 1001), c.slice(1001)]) for c in (result.column(k).combine_chunks() for k in keys)]
    np.testing.assert_array_equal(spark_hash(rechunked), expected)
    sliced = [result.column(k).combine_chunks().slice(17, 1500) for k in keys]
    np.testing.assert_array_equal(spark_hash(sliced), expected[17 : 17 + 1500])


# --------------------------------------------------------------------------
# No Spark needed below: encodings that must hash like their plain form.


def test_known_values():
    # Values printed by Spark 4.3: hash(42L), hash(cast(1 as tinyint)), hash('') .
    assert spark_hash([pa.array([42], pa.int64())]).tolist() == [1316951768]
    assert spark_hash([pa.array([1], pa.int8())]).tolist() == [-559580957]
    assert spark_hash([pa.array([None], pa.int64())]).tolist() == [42]
    assert spark_hash([pa.array([None, None], pa.null())]).tolist() == [42, 42]


def test_encodings_hash_like_plain_types():
    strs = pa.array(["a", None, "héllo wörld 😀", "", "abcdefgh"])
    assert spark_hash([strs.dictionary_encode()]).tolist() == spark_hash([strs]).tolist()
    assert spark_hash([strs.cast(pa.large_string())]).tolist() == spark_hash([strs]).tolist()
    assert spark_hash([strs.cast(pa.string_view())]).tolist() == spark_hash([strs]).tolist()
    bins = pa.array([b"abcde", None, b"\x80\xff\x00\x01\x7f"], pa.binary(5))
    assert spark_hash([bins]).tolist() == spark_hash([bins.cast(pa.binary())]).tolist()
    fsl = pa.array([[1, 2], None, [3, None]], pa.list_(pa.int32(), 2))
    assert spark_hash([fsl]).tolist() == spark_hash([fsl.cast(pa.list_(pa.int32()))]).tolist()


def test_types_argument_casts_before_hashing():
    ints = pa.array([1, -5, None], pa.int32())
    as_long = spark_hash([ints], types=[pa.int64()])
    assert as_long.tolist() == spark_hash([ints.cast(pa.int64())]).tolist()
    assert as_long[:2].tolist() != spark_hash([ints])[:2].tolist()  # hashLong, not hashInt
    with pytest.raises(ValueError, match="1 columns but 2 types"):
        spark_hash([ints], types=[pa.int64(), pa.int64()])


@pytest.mark.parametrize(
    "arr, fragment",
    [
        (pa.array([1], pa.uint32()), "uint32"),
        (pa.array([{1: 2}], pa.map_(pa.int32(), pa.int32())), "map<int32, int32>"),
        (pa.array([np.float16(1)], pa.float16()), "halffloat"),
        (pa.array([[1]], pa.list_(pa.uint8())), "uint8"),
    ],
)
def test_unsupported_types_raise(arr, fragment):
    with pytest.raises(TypeError, match=fragment):
        spark_hash([arr])


def test_partition_ids_errors_and_empty():
    batch = pa.record_batch({"k": pa.array([], pa.int64())})
    assert spark_partition_ids(batch, ["k"], 4).tolist() == []
    with pytest.raises(KeyError, match="nope"):
        spark_partition_ids(batch, ["nope"], 4)
    with pytest.raises(ValueError, match=">= 1"):
        spark_partition_ids(batch, ["k"], 0)
