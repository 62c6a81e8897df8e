"""Spill files: a data file plus an index per result partition.

The data file holds buffer payloads in arrival order; the index, written when
the partition finishes, lists for every subpartition its buffers in sequence
order as (offset, length, kind, flags). A broadcast buffer is stored once and
indexed by every subpartition. Local consumers may read both directly.

File descriptors are bounded: a data file is open for writing only until its
partition finishes; reads of finished files go through a service-wide LRU of
read-only descriptors (``maxOpenSpillFiles``), so thousands of finished
partitions do not hold thousands of fds.
"""
from __future__ import annotations

import os
import struct
from collections import OrderedDict
from pathlib import Path

import numpy as np

INDEX_ENTRY = struct.Struct(">iqqiBB")  # subpartition, seq, offset, length, kind, flags
INDEX_MAGIC = b"SFXIDX01"
_KINDS = (0, 1, 2)  # BufferKind: data, end of partition, marker (not imported: network/ is above partition/)
_END_OF_PARTITION = 1


class SpillCorruptError(OSError):
    """A spill data or index file does not hold what its partition wrote (damaged, truncated, replaced)."""


class SpillReaders:
    """At most ``capacity`` read-only fds of finished spill files, least recently used closed first."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = max(1, capacity)
        self._fds: OrderedDict[Path, int] = OrderedDict()

    def fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        while len(self._fds) >= self.capacity:
            os.close(self._fds.popitem(last=False)[1])
        fd = os.open(path, os.O_RDONLY)
        self._fds[path] = fd
        return fd

    def forget(self, path: Path) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def __len__(self) -> int:
        return len(self._fds)


DEFAULT_READERS = SpillReaders()


class SpillFile:
    def __init__(self, path: Path, readers: SpillReaders | None = None) -> None:
        self.path = Path(path)
        self.index_path = self.path.with_suffix(".index")
        self.readers = readers if readers is not None else DEFAULT_READERS
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)  # -1 once finished
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
        fd = self._fd if self._fd >= 0 else self.readers.fd(self.path)
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise SpillCorruptError(f"spill file {self.path} is corrupt (truncated): wanted {length} bytes at "
                                    f"{offset}, got {len(data)}")
        return data

    def write_index(self, entries: list[tuple[int, int, int, int, int, int]]) -> None:
        tmp = self.index_path.with_suffix(".index.tmp")
        with open(tmp, "wb") as f:
            f.write(INDEX_MAGIC)
            f.write(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
        os.replace(tmp, self.index_path)

    def close(self) -> None:
        """Written completely: the write fd goes; reads use the shared LRU from now on."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.readers.forget(self.path)
        for p in (self.path, self.index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


_INDEX_DTYPE = np.dtype([("sub", ">i4"), ("seq", ">i8"), ("offset", ">i8"), ("length", ">i4"), ("kind", "u1"),
                         ("flags", "u1")])
assert _INDEX_DTYPE.itemsize == INDEX_ENTRY.size


def read_index(index_path: Path, subpartition: int, end: int | None = None,
               data_size: int | None = None) -> list[tuple[int, int, int, int, int]]:
    """(seq, offset, length, kind, flags) of subpartitions ``subpartition..end-1`` (default: just one), in order.

    One vectorised pass over the index whatever the range (a coalesced read asks for many subpartitions of
    every producer): select the range, order by (subpartition, seq). The caller skips non-data entries.
    What it returns is checked, so a damaged index is a :class:`SpillCorruptError` naming the file, never
    a short read or a deep traceback: every subpartition of the range has entries numbered 0..n-1 ending
    with its end-of-partition, known kinds, and (given ``data_size``) extents inside the data file.
    """
    data = Path(index_path).read_bytes()

    def corrupt(what: str) -> SpillCorruptError:
        return SpillCorruptError(f"spill index {index_path} is corrupt: {what}")

    if not data.startswith(INDEX_MAGIC):
        raise corrupt("it does not start with the index magic")
    body = memoryview(data)[len(INDEX_MAGIC):]
    if len(body) % _INDEX_DTYPE.itemsize:
        raise corrupt(f"{len(body)} bytes of entries are not a whole number of {_INDEX_DTYPE.itemsize}-byte "
                      "entries (truncated?)")
    entries = np.frombuffer(body, dtype=_INDEX_DTYPE)
    stop = subpartition + 1 if end is None else end
    sub = entries["sub"]
    picked = entries[(sub >= subpartition) & (sub < stop)]
    picked = picked[np.lexsort((picked["seq"], picked["sub"]))]
    _check_entries(picked, subpartition, stop, data_size, corrupt)
    return list(zip(picked["seq"].tolist(), picked["offset"].tolist(), picked["length"].tolist(),
                    picked["kind"].tolist(), picked["flags"].tolist()))


def _check_entries(picked: np.ndarray, start: int, stop: int, data_size: int | None, corrupt) -> None:
    """Vectorised sanity checks of one range's index entries (sorted by subpartition, then seq)."""
    counts = np.bincount(picked["sub"].astype(np.int64) - start, minlength=stop - start)
    if counts.size and counts.min() == 0:
        raise corrupt(f"subpartition {start + int(np.argmin(counts))} has no entries")
    starts = np.cumsum(counts) - counts
    expected = np.arange(len(picked), dtype=np.int64) - np.repeat(starts, counts)
    if not np.array_equal(picked["seq"].astype(np.int64), expected):
        raise corrupt("sequence numbers are not 0..n-1 in every subpartition")
    kinds = picked["kind"]
    if not np.isin(kinds, _KINDS).all():
        raise corrupt(f"unknown buffer kind {int(kinds[~np.isin(kinds, _KINDS)][0])}")
    if not (kinds[np.cumsum(counts) - 1] == _END_OF_PARTITION).all():
        raise corrupt("a subpartition does not end with its end-of-partition entry")
    offsets, lengths = picked["offset"].astype(np.int64), picked["length"].astype(np.int64)
    if (offsets < 0).any() or (lengths < 0).any():
        raise corrupt("negative offset or length")
    if data_size is not None and len(picked) and int((offsets + lengths).max()) > data_size:
        raise corrupt(f"an entry reaches byte {int((offsets + lengths).max())} of a data file of {data_size} bytes")
