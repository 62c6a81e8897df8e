"""Finished spill data files mapped read-only, kept open across this process's read tasks.

An exact read of a wide exchange reads one small piece of every producer's file (200 producers x 200
subpartitions: a read task touches 200 files for about 5 KiB each), and Spark runs a worker's next read
task in the same process. Opening, mapping and closing every file in every task cost more than reading
it (measured outside Spark: 6 ms per such task, 2.2 ms with the files kept mapped); so a process keeps the
files it read in a small LRU (:data:`OPEN_FILES`): a later task pays two ``fstat`` calls per file (no path
walk) to make sure it is still the same, complete file: the index still linked and of the size and mtime
parsed (the service never changes a finished file, a drop unlinks it, a new partition gets a new name),
the data file's size unchanged.

Every buffer is a slice of the mapping (no copy: the reader's CRC32C pass is the only pass over the bytes,
and Arrow decodes straight from it).

Lifetime: a slice holds the ``mmap`` object through the buffer protocol, so the mapping stays valid as long
as any batch decoded from it lives, even once the cache let it go. Each cached file holds two fds (the
mapping's own duplicate and the index's), and a dropped (unlinked) file's disk space stays in use while
it is cached: the cache holds at most :attr:`OpenSpillFiles.max_files` files, forgets a file
unused for :attr:`OpenSpillFiles.idle_seconds` (checked on every lookup) or found gone, and Spark ends idle
Python workers after a minute anyway.

Truncation: touching a mapped page past the end of a truncated file raises SIGBUS. Each lookup checks the
file's size (``fstat`` of the mapping) before the task reads it, a read of at least :data:`MAP_MIN` bytes checks it
again with ``fstat`` right before its bytes are handed out, and the index was checked against the size.
Only an outside writer cutting the file between those checks and the CRC pass could still do it.
"""
from __future__ import annotations

import mmap
import os
import resource
import threading
import time
from collections import OrderedDict

import pyarrow as pa

from ..partition.spill import SpillCorruptError, index_range, parse_index

MAP_MIN = 64 << 10  # reads at least this large check the file's size again right before they are handed out


class SpillData:
    """One finished spill data file, mapped read-only, with its parsed index (two fds: the mapping's own and
    the index's, kept to notice with ``fstat`` a file changed or removed since)."""

    def __init__(self, path: str, index_path: str) -> None:
        self.path = path
        self.index_path = index_path
        self.last_used = time.monotonic()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            self.size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, self.size, prot=mmap.PROT_READ) if self.size else None
        finally:
            os.close(fd)
        self._map = pa.py_buffer(self._mmap) if self._mmap is not None else pa.py_buffer(b"")
        self._index_fd = os.open(index_path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(self._index_fd)
            self._index_key = (st.st_size, st.st_mtime_ns)
            with os.fdopen(os.dup(self._index_fd), "rb") as f:
                data = f.read()
            self.index = parse_index(data, self._corrupt_index)
        except BaseException:
            self.close()
            raise
        self.cost = self.index[0].nbytes + 72 * len(self.index[1])  # memory of the parsed index

    def _corrupt_index(self, what: str) -> SpillCorruptError:
        return SpillCorruptError(f"spill index {self.index_path} is corrupt: {what}")

    def unchanged(self) -> bool:
        """Still the file this object mapped, whole, and its index as parsed (two ``fstat`` calls, no path walk)."""
        if self._index_fd < 0:
            return False
        st = os.fstat(self._index_fd)
        if st.st_nlink == 0 or (st.st_size, st.st_mtime_ns) != self._index_key:
            return False  # removed (a drop unlinks both files) or rewritten
        return self._mmap is None or self._mmap.size() == self.size

    def entries(self, subpartition: int, end: int | None = None) -> list[tuple[int, int, int, int, int]]:
        """(seq, offset, length, kind, flags) of subpartitions ``subpartition..end-1``, checked against the file."""
        return index_range(self.index, subpartition, end, self.size, self._corrupt_index)

    def read(self, offset: int, length: int) -> pa.Buffer:
        """``length`` bytes at ``offset``: a :class:`SpillCorruptError` if the file does not hold them."""
        size = self.size
        if length >= MAP_MIN and self._mmap is not None:
            size = min(size, self._mmap.size())  # fstat of the mapping's fd: never touch a page past the end
        if offset < 0 or length < 0 or offset + length > size:
            raise SpillCorruptError(f"spill file {self.path} is corrupt (truncated): wanted {length} bytes at "
                                    f"{offset}, the file has {size}")
        return self._map.slice(offset, length)

    def close(self) -> None:
        """Out of the cache: the index fd goes now; the mapping (and its fd) with the last reader or batch using it."""
        if self._index_fd >= 0:
            os.close(self._index_fd)
            self._index_fd = -1


class OpenSpillFiles:
    """The process's mapped spill files, newest used last; see the module's docstring."""

    def __init__(self, max_files: int, max_index_bytes: int = 64 << 20, idle_seconds: float = 30.0) -> None:
        self.max_files = max_files
        self.max_index_bytes = max_index_bytes
        self.idle_seconds = idle_seconds
        self._files: OrderedDict[str, SpillData] = OrderedDict()
        self._index_bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str, index_path: str) -> SpillData:
        """The file at ``path`` as it is now, with its index (OSError if either cannot be opened)."""
        now = time.monotonic()
        with self._lock:
            data = self._files.get(path)
            if data is not None:
                if data.unchanged():
                    self._files.move_to_end(path)
                    data.last_used = now
                    self._expire(now)
                    return data
                self._drop(path)
        try:
            data = SpillData(path, index_path)
        except FileNotFoundError:
            self._sweep()  # one file gone (a drop): let go of every cached file that went with it
            raise
        with self._lock:
            if path in self._files:
                self._drop(path)
            self._files[path] = data
            self._index_bytes += data.cost
            self._expire(now)
        return data

    def _drop(self, path: str) -> None:
        data = self._files.pop(path)
        self._index_bytes -= data.cost
        data.close()

    def _expire(self, now: float) -> None:
        files = self._files
        while len(files) > 1:
            oldest = next(iter(files.values()))
            if len(files) <= self.max_files and self._index_bytes <= self.max_index_bytes and \
                    now - oldest.last_used < self.idle_seconds:
                break
            self._drop(oldest.path)

    def _sweep(self) -> None:
        with self._lock:
            for path in [p for p, data in self._files.items() if not data.unchanged()]:
                self._drop(path)

    def cached(self, path: str) -> bool:
        return path in self._files

    def clear(self) -> None:
        with self._lock:
            for path in list(self._files):
                self._drop(path)

    def __len__(self) -> int:
        return len(self._files)


def _default_max_files() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(256, (soft if soft > 0 else 1024) // 8))  # two fds per file


OPEN_FILES = OpenSpillFiles(_default_max_files())


def open_spill_data(path: str, index_path: str) -> SpillData:
    """A finished spill data file, mapped, and its index (from this process's cache when both are unchanged)."""
    return OPEN_FILES.get(path, index_path)
