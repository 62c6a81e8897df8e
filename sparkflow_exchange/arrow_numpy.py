"""Arrow arrays made from NumPy without pyarrow's converters.

``pa.array(ndarray)``, ``RecordBatch.from_pylist`` and ``Array.to_numpy`` import pandas on their first call
when it is installed (pyarrow looks for pandas objects): half a second in every fresh Spark or DataLoader
worker, before its first rows move. The writer, the hash and the training loop build their arrays here.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa


def indices(values: np.ndarray) -> pa.Array:
    """``values`` as an int64 Arrow array (row numbers for ``take``), sharing its memory when it is int64."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows with ``schema``."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, field.type) for field in schema], schema=schema)
