"""Spark's ``hash()`` (Murmur3 x86_32, seed 42), vectorised over Arrow arrays.

The ``hash`` channel selector must put every row in the subpartition that
Spark's own ``repartition(n, *keys)`` would pick, so a consumer reading
subpartition *i* sees exactly Spark's partition *i*. That only holds if this
module reproduces Spark bit for bit, including its quirks: strings use
``hashUnsafeBytes`` (each tail byte mixed on its own, sign-extended), floats
normalise -0.0 and NaN, decimals switch representation at precision 18, and
a null leaves the running hash unchanged. The specification is
``shared/spark-hash.md``; the tests compare against a live Spark.

All arithmetic is on NumPy ``uint32`` arrays, whose multiplication, addition
and shifts wrap modulo 2**32 by construction (the 32-bit mask is the dtype);
64-bit values are split into 32-bit halves with an explicit ``& 0xFFFFFFFF``
style truncation. There is no Python loop per row: loops run over key
columns, over 4-byte block positions of strings, over list element positions
and over the distinct byte lengths of wide decimals.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from ..arrow_numpy import fixed_values, indices, unpack_bits, validity

__all__ = ["DEFAULT_SEED", "spark_hash", "spark_partition_ids", "check_hashable"]

#: Seed Spark's ``hash()`` and hash partitioning start from.
DEFAULT_SEED = 42

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_H_ADD = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)
_U32_MASK = np.uint64(0xFFFFFFFF)

_FLOAT_NAN_BITS = np.uint32(0x7FC00000)
_DOUBLE_NAN_BITS = np.uint64(0x7FF8000000000000)

_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}

ArrayLike = pa.Array | pa.ChunkedArray

# Rows hashed per pass; keeps the uint32 temporaries in L2 cache.
_CHUNK_ROWS = 1 << 15


# --------------------------------------------------------------------------
# Murmur3 building blocks, in place on uint32 arrays


def _rotl(x: np.ndarray, r: int) -> None:
    tmp = x >> (32 - r)
    x <<= r
    x |= tmp


def _mix_k1(k: np.ndarray) -> None:
    k *= _C1
    _rotl(k, 15)
    k *= _C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> None:
    h ^= k
    _rotl(h, 13)
    h *= np.uint32(5)
    h += _H_ADD


def _fmix(h: np.ndarray, length: np.ndarray | int) -> None:
    h ^= np.asarray(length).astype(np.uint32, copy=False)
    h ^= h >> 16
    h *= _F1
    h ^= h >> 13
    h *= _F2
    h ^= h >> 16


def _hash_int(values_u32: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """hashInt; consumes ``values_u32`` (must be a private copy)."""
    h = seed.copy()
    _mix_k1(values_u32)
    _mix_h1(h, values_u32)
    _fmix(h, 4)
    return h


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """hashLong of int64/uint64 values: low word first, then high word."""
    u = values.view(np.uint64)
    low = (u & _U32_MASK).astype(np.uint32)
    high = (u >> np.uint64(32)).astype(np.uint32)
    h = seed.copy()
    _mix_k1(low)
    _mix_h1(h, low)
    _mix_k1(high)
    _mix_h1(h, high)
    _fmix(h, 8)
    return h


def _sign_extended_bytes(b: np.ndarray) -> np.ndarray:
    """Tail bytes as Java does: a signed byte widened to int32."""
    return b.view(np.int8).astype(np.int32).view(np.uint32)


def _hash_fixed_bytes(mat: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """hashUnsafeBytes of rows of a (m, L) uint8 matrix, all of length L."""
    m, length = mat.shape
    h = seed.copy()
    nblocks = length // 4
    if nblocks:
        words = np.ascontiguousarray(mat[:, : 4 * nblocks]).view("<u4")
        for j in range(nblocks):
            k = words[:, j].astype(np.uint32)
            _mix_k1(k)
            _mix_h1(h, k)
    for t in range(4 * nblocks, length):
        k = _sign_extended_bytes(np.ascontiguousarray(mat[:, t]))
        _mix_k1(k)
        _mix_h1(h, k)
    _fmix(h, length)
    return h


def _hash_var_bytes(
    offsets: np.ndarray, data: np.ndarray, seed: np.ndarray, valid: np.ndarray | None
) -> np.ndarray:
    """hashUnsafeBytes of variable-length values given Arrow offsets and data.

    Loops over 4-byte block positions; at each position only the rows that
    still have a whole block take part, compacted so that a few long values
    do not make every short row pay for them.
    """
    starts = offsets[:-1].astype(np.int64, copy=False)
    lengths = offsets[1:] - offsets[:-1]
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    n = len(starts)
    h = seed.copy()
    if n == 0:
        return h
    nblocks = lengths >> 2
    max_blocks = int(nblocks.max())
    if max_blocks:
        # Every byte offset read as a little-endian uint32 (an unaligned,
        # overlapping view); a gather then loads whole blocks at once.
        words = np.ndarray(
            shape=(max(len(data) - 3, 0),), dtype="<u4", buffer=data, strides=(1,)
        )
        idx: np.ndarray | None = None  # None: all rows still active
        hs = h
        pos = starts.copy()
        nb = nblocks
        for j in range(max_blocks):
            keep = nb > j
            if not keep.all():
                if idx is None:
                    idx = np.flatnonzero(keep)
                    hs = hs[keep]
                else:
                    h[idx[~keep]] = hs[~keep]
                    idx = idx[keep]
                    hs = hs[keep]
                pos = pos[keep]
                nb = nb[keep]
            k = words[pos].astype(np.uint32)  # private copy, native order
            _mix_k1(k)
            _mix_h1(hs, k)
            pos += 4
        if idx is not None:
            h[idx] = hs
    tails = lengths & 3
    tail_starts = starts + (nblocks << 2)
    for t in range(3):
        rows = tails > t
        if not rows.any():
            break
        if rows.all():
            k = _sign_extended_bytes(data[tail_starts + t])
            _mix_k1(k)
            _mix_h1(h, k)
        else:
            sel = np.flatnonzero(rows)
            k = _sign_extended_bytes(data[tail_starts[sel] + t])
            hs = h[sel]
            _mix_k1(k)
            _mix_h1(hs, k)
            h[sel] = hs
    _fmix(h, lengths)
    return h


# --------------------------------------------------------------------------
# Arrow plumbing


def _decimal_bytes(arr: pa.Array) -> np.ndarray:
    width = arr.type.byte_width
    return np.frombuffer(
        arr.buffers()[1], dtype=np.uint8, count=len(arr) * width, offset=arr.offset * width
    ).reshape(len(arr), width)


def _is_decimal(t: pa.DataType) -> bool:
    return pat.is_decimal(t)


def _unsupported(t: pa.DataType, why: str = "") -> TypeError:
    extra = f" ({why})" if why else ""
    return TypeError(f"Spark hash does not support column type {t}{extra}")


def check_hashable(t: pa.DataType) -> None:
    """Raise TypeError early (e.g. when a writer opens) for key types we cannot place."""
    if pat.is_dictionary(t):
        return check_hashable(t.value_type)
    if (
        pat.is_null(t)
        or pat.is_boolean(t)
        or pat.is_signed_integer(t)
        or pat.is_float32(t)
        or pat.is_float64(t)
        or pat.is_date(t)
        or pat.is_timestamp(t)
        or pat.is_time(t)
        or pat.is_duration(t)
        or _is_decimal(t)
        or pat.is_string(t)
        or pat.is_large_string(t)
        or pat.is_binary(t)
        or pat.is_large_binary(t)
        or pat.is_string_view(t)
        or pat.is_binary_view(t)
        or pat.is_fixed_size_binary(t)
    ):
        return None
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t):
        return check_hashable(t.value_type)
    if pat.is_struct(t):
        for i in range(t.num_fields):
            check_hashable(t.field(i).type)
        return None
    if pat.is_map(t):
        raise _unsupported(t, "Spark refuses hash() on maps")
    if pat.is_unsigned_integer(t):
        raise _unsupported(t, "Spark has no unsigned integers; cast to a signed type")
    raise _unsupported(t)


def _hash_array(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """H(value, seed) for every row of one Arrow array; null rows keep the seed."""
    t = arr.type
    n = len(arr)
    if pat.is_null(t):
        return seed.copy()
    if pat.is_dictionary(t):
        return _hash_array(arr.dictionary_decode(), seed)
    if pat.is_string_view(t) or pat.is_binary_view(t):
        target = pa.large_string() if pat.is_string_view(t) else pa.large_binary()
        return _hash_array(arr.cast(target), seed)
    if pat.is_fixed_size_list(t):
        return _hash_array(arr.cast(pa.large_list(t.value_field)), seed)

    valid = validity(arr)
    if valid is not None and not valid.any():
        return seed.copy()

    if pat.is_boolean(t):
        v = unpack_bits(arr.buffers()[1], arr.offset, n)
        h = _hash_int(v.astype(np.uint32), seed)
    elif pat.is_int8(t) or pat.is_int16(t) or pat.is_int32(t) or pat.is_date32(t):
        np_t = {1: np.int8, 2: np.int16, 4: np.int32}[t.bit_width // 8]
        v = fixed_values(arr, np_t).astype(np.int32).view(np.uint32)
        h = _hash_int(v, seed)
    elif pat.is_date64(t):
        days = fixed_values(arr, np.int64) // 86_400_000
        h = _hash_int(days.astype(np.int32).view(np.uint32), seed)
    elif pat.is_int64(t):
        h = _hash_long(fixed_values(arr, np.int64), seed)
    elif pat.is_timestamp(t) or pat.is_duration(t):
        # Spark stores both as microseconds (UTC for timestamps); ns truncates
        # towards -inf like Instant -> micros does.
        v = fixed_values(arr, np.int64)
        mult = _US_PER_UNIT[t.unit]
        v = v // 1000 if mult is None else (v * mult if mult != 1 else v)
        h = _hash_long(v, seed)
    elif pat.is_time(t):
        # Spark's TIME is nanoseconds since midnight in a long.
        width = 4 if pat.is_time32(t) else 8
        v = fixed_values(arr, np.int32 if width == 4 else np.int64).astype(np.int64)
        mult = _NS_PER_UNIT[t.unit]
        h = _hash_long(v * mult if mult != 1 else v, seed)
    elif pat.is_float32(t):
        f = fixed_values(arr, np.float32)
        bits = f.view(np.uint32).copy()
        bits[f == 0] = 0  # -0.0 hashes like 0.0
        bits[np.isnan(f)] = _FLOAT_NAN_BITS  # every NaN is the canonical one
        h = _hash_int(bits, seed)
    elif pat.is_float64(t):
        f = fixed_values(arr, np.float64)
        bits = f.view(np.uint64).copy()
        bits[f == 0] = 0
        bits[np.isnan(f)] = _DOUBLE_NAN_BITS
        h = _hash_long(bits, seed)
    elif _is_decimal(t):
        h = _hash_decimal(arr, seed)
    elif pat.is_string(t) or pat.is_binary(t) or pat.is_large_string(t) or pat.is_large_binary(t):
        large = pat.is_large_string(t) or pat.is_large_binary(t)
        off_t = np.int64 if large else np.int32
        bufs = arr.buffers()
        offsets = np.frombuffer(
            bufs[1], dtype=off_t, count=n + 1, offset=arr.offset * np.dtype(off_t).itemsize
        )
        data = (
            np.frombuffer(bufs[2], dtype=np.uint8)
            if bufs[2] is not None
            else np.zeros(0, np.uint8)
        )
        h = _hash_var_bytes(offsets, data, seed, valid)
    elif pat.is_fixed_size_binary(t):
        width = t.byte_width
        mat = np.frombuffer(
            arr.buffers()[1], dtype=np.uint8, count=n * width, offset=arr.offset * width
        ).reshape(n, width)
        h = _hash_fixed_bytes(mat, seed)
    elif pat.is_list(t) or pat.is_large_list(t):
        h = _hash_list(arr, seed, valid)
    elif pat.is_struct(t):
        h = seed
        for i in range(t.num_fields):
            h = _hash_array(arr.field(i), h)
        if h is seed:
            h = seed.copy()
    else:
        check_hashable(t)  # raises with the reason
        raise _unsupported(t)

    if valid is not None:
        np.copyto(h, seed, where=~valid)
    return h


def _hash_decimal(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    t = arr.type
    width = t.byte_width
    if t.precision <= 18:
        # Unscaled value fits a long: the low 64 bits of two's complement.
        if width in (4, 8):
            v = fixed_values(arr, f"<i{width}").astype(np.int64)
        else:
            dt = np.dtype("<u8")
            v = np.frombuffer(
                arr.buffers()[1],
                dtype=dt,
                count=len(arr) * width // 8,
                offset=arr.offset * width,
            )[:: width // 8]
        return _hash_long(np.ascontiguousarray(v), seed)

    # Java BigInteger.toByteArray(): minimal big-endian two's complement.
    mat = _decimal_bytes(arr)  # little-endian bytes, one row per value
    n = len(arr)
    h = seed.copy()
    if n == 0:
        return h
    negative = mat[:, -1] >= 0x80
    sign_byte = np.where(negative, np.uint8(0xFF), np.uint8(0))
    differs = mat != sign_byte[:, None]
    any_diff = differs.any(axis=1)
    top = width - 1 - np.argmax(differs[:, ::-1], axis=1)  # highest non-sign byte
    top_sign = (mat[np.arange(n), top] >= 0x80) != negative
    nbytes = np.where(any_diff, np.where(top_sign, top + 2, top + 1), 1)
    for length in np.unique(nbytes):
        rows = np.flatnonzero(nbytes == length)
        big_endian = mat[rows][:, length - 1 :: -1]
        h[rows] = _hash_fixed_bytes(big_endian, seed[rows])
    return h


def _hash_list(arr: pa.Array, seed: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """Fold H over list elements in order; null elements keep the running hash."""
    offs = arr.offsets  # sliced, absolute
    offsets = fixed_values(offs, f"int{offs.type.bit_width}").astype(np.int64, copy=False)
    values = arr.values  # unsliced, matches the absolute offsets
    lengths = offsets[1:] - offsets[:-1]
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    h = seed.copy()
    if len(lengths) == 0:
        return h
    idx = np.flatnonzero(lengths > 0)
    for j in range(int(lengths.max())):
        if j:
            idx = idx[lengths[idx] > j]
        elems = values.take(indices(offsets[idx] + j))
        h[idx] = _hash_array(elems, h[idx])
    return h


# --------------------------------------------------------------------------
# Public API


def _as_array(col: ArrayLike) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if isinstance(col, pa.Array):
        return col
    raise TypeError(f"expected a pyarrow Array or ChunkedArray, got {type(col).__name__}")


def spark_hash(
    columns: Sequence[ArrayLike],
    types: Sequence[pa.DataType] | None = None,
    seed: int = DEFAULT_SEED,
) -> np.ndarray:
    """Spark's ``hash(*columns)`` per row, as int32.

    The running hash of one column is the seed of the next, exactly as Spark
    folds ``hash(a, b, c)``. ``types``, when given, is the Spark-side type of
    each column (for example a decimal precision other than the Arrow one);
    the column is cast to it before hashing, because the precision decides
    the representation that gets hashed.
    """
    if not columns:
        raise ValueError("spark_hash needs at least one column")
    if types is not None and len(types) != len(columns):
        raise ValueError(f"got {len(columns)} columns but {len(types)} types")
    arrays = [_as_array(c) for c in columns]
    n = len(arrays[0])
    for a in arrays[1:]:
        if len(a) != n:
            raise ValueError(f"columns differ in length: {n} vs {len(a)}")
    if types is not None:
        arrays = [a if a.type == t else a.cast(t) for a, t in zip(arrays, types)]
    for a in arrays:
        check_hashable(a.type)
    out = np.full(n, np.uint32(seed & 0xFFFFFFFF), dtype=np.uint32)
    # Work in cache-sized row chunks: every Murmur3 step is a pass over the
    # data, and those passes are memory-bound on large arrays.
    for start in range(0, n, _CHUNK_ROWS):
        stop = min(start + _CHUNK_ROWS, n)
        h = out[start:stop]
        for a in arrays:
            h = _hash_array(a.slice(start, stop - start) if n > _CHUNK_ROWS else a, h)
        out[start:stop] = h
    return out.view(np.int32)


def spark_partition_ids(
    batch: pa.RecordBatch | pa.Table, keys: Sequence[str], num_partitions: int
) -> np.ndarray:
    """The partition ``df.repartition(num_partitions, *keys)`` gives each row.

    ``pmod`` of the hash, never negative, so a consumer of subpartition *i*
    sees the same rows as Spark's partition *i*.
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if not keys:
        raise ValueError("spark_partition_ids needs at least one key")
    names = batch.schema.names
    missing = [k for k in keys if k not in names]
    if missing:
        raise KeyError(f"keys {missing} not in columns {names}")
    h = spark_hash([batch.column(k) for k in keys])
    return np.mod(h, np.int32(num_partitions)).astype(np.int32, copy=False)
