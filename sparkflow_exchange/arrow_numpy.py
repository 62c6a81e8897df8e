"""Arrow arrays made from NumPy, and NumPy views of Arrow buffers, without pyarrow's converters.

``pa.array(ndarray)``, ``RecordBatch.from_pylist`` and ``Array.to_numpy`` import pandas on their first call
when it is installed (pyarrow looks for pandas objects): half a second in every fresh Spark or DataLoader
worker, before its first rows move. The writer, the hash and the training loop convert here.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.types as pat


def indices(values: np.ndarray) -> pa.Array:
    """``values`` as an int64 Arrow array (row numbers for ``take``), sharing its memory when it is int64."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows with ``schema``."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, field.type) for field in schema], schema=schema)


def unpack_bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """Arrow bitmap bits [offset, offset + n) as a uint8 0/1 array."""
    first = offset // 8
    shift = offset % 8
    nbytes = (shift + n + 7) // 8
    raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=first)
    return np.unpackbits(raw, bitorder="little", count=shift + n)[shift:]


def validity(arr: pa.Array) -> np.ndarray | None:
    """Boolean validity per row, or None when every row is valid."""
    if arr.null_count == 0:
        return None
    if pat.is_null(arr.type):
        return np.zeros(len(arr), dtype=bool)
    return unpack_bits(arr.buffers()[0], arr.offset, len(arr)).view(bool)


def fixed_values(arr: pa.Array, dtype: str | np.dtype) -> np.ndarray:
    """Zero-copy view of a fixed-width array's values (null slots arbitrary)."""
    dt = np.dtype(dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dt, count=len(arr), offset=arr.offset * dt.itemsize)
