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
import threading
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np  # imported where an index is parsed: the service starts without it (about 45 ms)

INDEX_ENTRY = struct.Struct(">iqqiBB")  # subpartition, seq, offset, length, kind, flags
INDEX_MAGIC = b"SFXIDX01"
_KINDS = (0, 1, 2)  # BufferKind: data, end of partition, marker (not imported: network/ is above partition/)
_END_OF_PARTITION = 1


class SpillCorruptError(OSError):
    """A spill data or index file does not hold what its partition wrote (damaged, truncated, replaced)."""


class DiskFullError(RuntimeError):
    """A spill write would take a service's spill files beyond their bound (``maxDiskBytes``)."""


class DiskBudget:
    """The bytes of spill files a service may hold at once; every spill file of the service draws on it.

    Exchanges outlive the applications that wrote them (until dropped or ``ttl``), so without a bound
    forgotten exchanges could fill the disk; a write that would pass the bound fails saying so.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, nbytes: int, path: Path) -> None:
        if self.used + nbytes > self.limit:
            raise DiskFullError(
                f"the service's spill files would exceed maxDiskBytes={self.limit} bytes (holding {self.used}, "
                f"{nbytes} more for {path.name}): drop exchanges you no longer need (`sparkflow-exchange list`, "
                "`sparkflow-exchange drop NAME`), lower ttl, or raise maxDiskBytes")
        self.used += nbytes

    def give(self, nbytes: int) -> None:
        self.used = max(0, self.used - nbytes)


class DiskShare:
    """One credential's share of the service's :class:`DiskBudget` (``credentialDiskShare`` of maxDiskBytes):
    its spill files draw on both, so one application filling the disk leaves room for the others."""

    def __init__(self, shared: DiskBudget, name: str, limit: int) -> None:
        self.shared = shared
        self.name = name
        self.limit = limit
        self.used = 0

    def take(self, nbytes: int, path: Path) -> None:
        if self.used + nbytes > self.limit:
            raise DiskFullError(
                f"credential {self.name!r}'s spill files would exceed its share of the service's disk "
                f"(credentialDiskShare: {self.limit} of maxDiskBytes={self.shared.limit} bytes; it holds {self.used}, "
                f"{nbytes} more for {path.name}): drop exchanges it no longer needs (other credentials are not "
                "affected)")
        self.shared.take(nbytes, path)
        self.used += nbytes

    def give(self, nbytes: int) -> None:
        self.used = max(0, self.used - nbytes)
        self.shared.give(nbytes)


class FileSpan:
    """``length`` bytes at ``offset`` of a spill data file, for a connection to send from the file itself
    (``os.sendfile``: the kernel moves the pages, no read into memory and no copy in Python).

    It holds a descriptor of its own (a duplicate), so its bytes stay readable when the partition is released
    or its file unlinked before they are sent, as a buffer read into memory would; whoever ends up with it
    calls :meth:`close` once it is sent or dropped.
    """

    __slots__ = ("fd", "offset", "length", "path")

    def __init__(self, fd: int, offset: int, length: int, path: Path) -> None:
        self.fd = fd
        self.offset = offset
        self.length = length
        self.path = path

    def __len__(self) -> int:
        return self.length

    def read(self) -> bytes:
        """Its bytes, read into memory (where the file cannot be sent by the kernel)."""
        data = os.pread(self.fd, self.length, self.offset)
        if len(data) != self.length:
            raise SpillCorruptError(f"spill file {self.path} is corrupt (truncated): wanted {self.length} bytes at "
                                    f"{self.offset}, got {len(data)}")
        return data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


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


def _create_private(path: Path, flags: int) -> int:
    """A new file of this user only (0600), never opened through a link planted at ``path``."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


class SpillFile:
    def __init__(self, path: Path, readers: SpillReaders | None = None, disk: DiskBudget | DiskShare | None = None) -> None:
        self.path = Path(path)
        self.index_path = self.path.with_suffix(".index")
        self.readers = readers if readers is not None else DEFAULT_READERS
        self.disk = disk
        self._fd = _create_private(self.path, os.O_RDWR)  # -1 once finished
        self.size = 0

    def append(self, payload: bytes | memoryview) -> tuple[int, int]:
        offset = self.size
        view = memoryview(payload)
        if self.disk is not None:
            self.disk.take(len(view), self.path)
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

    def span(self, offset: int, length: int) -> FileSpan:
        """The bytes :meth:`read` would return, left in the file for a socket to send (:class:`FileSpan`). A file
        that no longer holds them is a :class:`SpillCorruptError` now, before anything of them is sent."""
        fd = self._fd if self._fd >= 0 else self.readers.fd(self.path)
        size = os.fstat(fd).st_size
        if size < offset + length:
            raise SpillCorruptError(f"spill file {self.path} is corrupt (truncated): wanted {length} bytes at "
                                    f"{offset}, the file holds {size}")
        return FileSpan(os.dup(fd), offset, length, self.path)

    def write_index(self, entries: list[tuple[int, int, int, int, int, int]]) -> None:
        tmp = self.index_path.with_suffix(".index.tmp")
        try:
            with os.fdopen(_create_private(tmp, os.O_WRONLY), "wb") as f:
                f.write(INDEX_MAGIC)
                f.write(b"".join(INDEX_ENTRY.pack(*e) for e in entries))
            os.replace(tmp, self.index_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def close(self) -> None:
        """Written completely: the write fd goes; reads use the shared LRU from now on."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        if self.disk is not None:
            self.disk.give(self.size)
            self.disk = None
        self.readers.forget(self.path)
        for p in (self.path, self.index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


@cache
def _index_dtype() -> "np.dtype":
    """An index entry as a NumPy record (``INDEX_ENTRY``)."""
    import numpy as np

    dtype = np.dtype([("sub", ">i4"), ("seq", ">i8"), ("offset", ">i8"), ("length", ">i4"), ("kind", "u1"),
                      ("flags", "u1")])
    assert dtype.itemsize == INDEX_ENTRY.size
    return dtype


class _IndexCache:
    """Parsed index files of this process, sorted by (subpartition, seq), newest used last, bounded in bytes.

    A read task of a 200 x 200 exchange reads one subpartition of 200 indexes, and Spark reuses its Python
    workers: without the cache each worker parses every index once per read task (0.5 ms each, most of
    such a task's cost); with it, once. An index is written once (atomically replaced), so (inode, size,
    mtime) names its content.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, index_path: Path | str, corrupt, st: os.stat_result | None = None) -> tuple:
        st = st or os.stat(index_path)
        key = (index_path if isinstance(index_path, str) else str(index_path), st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit[0]
        with open(index_path, "rb") as f:
            parsed = parse_index(f.read(), corrupt)
        cost = parsed[0].nbytes + 72 * len(parsed[1])  # the sorted entries, the two lists
        with self._lock:
            self._entries[key] = (parsed, cost)
            self._bytes += cost
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                _, (_old, old_cost) = self._entries.popitem(last=False)
                self._bytes -= old_cost
        return parsed


def parse_index(data: bytes, corrupt) -> tuple:
    """An index file's bytes, checked once as a whole and sorted by (subpartition, seq), ready for
    :func:`index_range`. ``corrupt(what)`` makes the error to raise."""
    import numpy as np

    if not data.startswith(INDEX_MAGIC):
        raise corrupt("it does not start with the index magic")
    body = memoryview(data)[len(INDEX_MAGIC):]
    dtype = _index_dtype()
    if len(body) % dtype.itemsize:
        raise corrupt(f"{len(body)} bytes of entries are not a whole number of {dtype.itemsize}-byte "
                      "entries (truncated?)")
    entries = np.frombuffer(body, dtype=dtype)
    entries = entries[np.lexsort((entries["seq"], entries["sub"]))]
    subs = entries["sub"].astype(np.int64)
    if len(subs) and subs[0] < 0:
        raise corrupt(f"negative subpartition {int(subs[0])}")
    width = int(subs[-1]) + 1 if len(subs) else 0
    # checked once for the whole index: each call then only looks its range up
    _check_entries(entries, 0, width, None, corrupt, allow_missing=True)
    extent = int((entries["offset"].astype(np.int64) + entries["length"].astype(np.int64)).max()) if len(subs) else 0
    # per subpartition: where its entries start (a list: a lookup is then plain Python, no NumPy call), and
    # how many subpartitions before it have none (a range is whole when that does not change across it)
    bounds = np.searchsorted(subs, np.arange(width + 1)).tolist()
    missing = np.concatenate(([0], np.cumsum(np.bincount(subs, minlength=width) == 0))).tolist()
    return entries, bounds, missing, extent


def index_range(parsed: tuple, subpartition: int, end: int | None, data_size: int | None,
                corrupt) -> list[tuple[int, int, int, int, int]]:
    """(seq, offset, length, kind, flags) of subpartitions ``subpartition..end-1`` of a parsed index."""
    entries, bounds, missing, extent = parsed
    stop = subpartition + 1 if end is None else end
    width = len(bounds) - 1
    if subpartition < 0 or stop > width or missing[stop] != missing[subpartition]:
        gap = next((i for i in range(subpartition, stop) if i < 0 or i >= width or bounds[i] == bounds[i + 1]), stop)
        raise corrupt(f"subpartition {gap} has no entries")
    if data_size is not None and extent > data_size:
        raise corrupt(f"an entry reaches byte {extent} of a data file of {data_size} bytes")
    return [e[1:] for e in entries[bounds[subpartition]:bounds[stop]].tolist()]


_INDEXES = _IndexCache(64 << 20)


def read_index(index_path: Path | str, subpartition: int, end: int | None = None,
               data_size: int | None = None, st: os.stat_result | None = None) -> list[tuple[int, int, int, int, int]]:
    """(seq, offset, length, kind, flags) of subpartitions ``subpartition..end-1`` (default: just one), in order.

    The index is parsed once per process (:class:`_IndexCache`); a range is then two list lookups and a slice. The
    caller skips non-data entries. What it returns is checked, so a damaged index is a
    :class:`SpillCorruptError` naming the file, never a short read or a deep traceback: every subpartition
    of the range has entries numbered 0..n-1 ending with its end-of-partition, known kinds, and (given
    ``data_size``) extents inside the data file. ``st``: the index file's ``os.stat``, when the caller took it.
    """
    def corrupt(what: str) -> SpillCorruptError:
        return SpillCorruptError(f"spill index {index_path} is corrupt: {what}")

    return index_range(_INDEXES.get(index_path, corrupt, st), subpartition, end, data_size, corrupt)


def _check_entries(picked: np.ndarray, start: int, stop: int, data_size: int | None, corrupt,
                   allow_missing: bool = False) -> None:
    """Vectorised sanity checks of one range's index entries (sorted by subpartition, then seq).

    Few NumPy calls on purpose: a read task of a 200-producer exchange checks 200 indexes, and each
    call on a tiny array costs microseconds.
    """
    import numpy as np

    subs = picked["sub"].astype(np.int64)
    counts = np.bincount(subs - start, minlength=stop - start)
    if counts.size and counts.min() == 0 and not allow_missing:
        raise corrupt(f"subpartition {start + int(np.argmin(counts))} has no entries")
    ends = np.cumsum(counts)
    expected = np.arange(len(picked), dtype=np.int64) - np.repeat(ends - counts, counts)
    if not np.array_equal(picked["seq"], expected):
        bad = int(np.flatnonzero(picked["seq"] != expected)[0])
        raise corrupt(f"sequence numbers of subpartition {int(subs[bad])} are not 0..n-1 (an entry is lost)")
    kinds = picked["kind"]
    if len(kinds) and int(kinds.max()) > max(_KINDS):
        raise corrupt(f"unknown buffer kind {int(kinds.max())}")
    if not (kinds[ends - 1] == _END_OF_PARTITION).all():
        raise corrupt("a subpartition does not end with its end-of-partition entry")
    offsets, lengths = picked["offset"].astype(np.int64), picked["length"].astype(np.int64)
    if len(picked) and (int(offsets.min()) < 0 or int(lengths.min()) < 0):
        raise corrupt("negative offset or length")
    if data_size is not None and len(picked) and int((offsets + lengths).max()) > data_size:
        raise corrupt(f"an entry reaches byte {int((offsets + lengths).max())} of a data file of {data_size} bytes")
