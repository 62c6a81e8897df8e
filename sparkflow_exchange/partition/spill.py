"""Spill files: a data file plus an index per result partition.

The data file holds buffer payloads in arrival order; the index, written when
the partition finishes, lists for every subpartition its buffers in sequence
order as (offset, length, kind, flags). A broadcast buffer is stored once and
indexed by every subpartition. Local consumers may read both directly.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

INDEX_ENTRY = struct.Struct(">iqqiBB")  # subpartition, seq, offset, length, kind, flags
INDEX_MAGIC = b"SFXIDX01"


class SpillFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.index_path = self.path.with_suffix(".index")
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        self.size = 0

    def append(self, payload: bytes | memoryview) -> tuple[int, int]:
        offset = self.size
        view = memoryview(payload)
        written = 0
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], offset + written)
        self.size += len(view)
        return offset, len(view)

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) != length:
            raise OSError(f"spill file {self.path} is truncated: wanted {length} bytes at {offset}, got {len(data)}")
        return data

    def write_index(self, entries: list[tuple[int, int, int, int, int, int]]) -> None:
        tmp = self.index_path.with_suffix(".index.tmp")
        with open(tmp, "wb") as f:
            f.write(INDEX_MAGIC)
            f.write(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
        os.replace(tmp, self.index_path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        for p in (self.path, self.index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


_INDEX_DTYPE = np.dtype([("sub", ">i4"), ("seq", ">i8"), ("offset", ">i8"), ("length", ">i4"), ("kind", "u1"),
                         ("flags", "u1")])
assert _INDEX_DTYPE.itemsize == INDEX_ENTRY.size


def read_index(index_path: Path, subpartition: int, end: int | None = None) -> list[tuple[int, int, int, int, int]]:
    """(seq, offset, length, kind, flags) of subpartitions ``subpartition..end-1`` (default: just one), in order.

    One vectorised pass over the index whatever the range (a coalesced read asks for many subpartitions of
    every producer): select the range, order by (subpartition, seq). The caller skips non-data entries.
    """
    data = Path(index_path).read_bytes()
    if not data.startswith(INDEX_MAGIC):
        raise OSError(f"{index_path} is not a sparkflow-exchange index file")
    body = memoryview(data)[len(INDEX_MAGIC):]
    if len(body) % _INDEX_DTYPE.itemsize:
        raise OSError(f"{index_path} is truncated")
    entries = np.frombuffer(body, dtype=_INDEX_DTYPE)
    stop = subpartition + 1 if end is None else end
    sub = entries["sub"]
    picked = entries[(sub >= subpartition) & (sub < stop)]
    picked = picked[np.lexsort((picked["seq"], picked["sub"]))]
    return list(zip(picked["seq"].tolist(), picked["offset"].tolist(), picked["length"].tolist(),
                    picked["kind"].tolist(), picked["flags"].tolist()))
