"""A writer's shared-memory arena: the partition pool's slots, mapped by writer and service.

Flink's producer writes records straight into buffers of its result
partition's pool; here the pool lives in the service, another process. On the
same host the writer gets the same effect through a file in ``/dev/shm``
(tmpfs, never written back to disk) that both processes map: the writer
serialises a batch straight into a free slot and sends a 40-byte
``PushSharedBuffer`` instead of the buffer, so the payload crosses no socket
on its way into the partition (two copies saved: the writer's send and the
service's receive). The service says which slots it has stopped reading
(``SlotsFreed``); slots are the pool's slots, so credit still means free slots.

Local readers get the same shortcut the other way: the service sends them a
reference (``FLAG_SHARED``) instead of the bytes, the reader copies the
buffer out of the slot (``ArenaReader``) and says so (``SharedBuffersRead``);
only then is the slot the writer's again.

Names carry the pid of the process responsible for the file: the writer's
until the service maps it, then the service renames it to its own and
unlinks it when the partition is released. ``sweep_orphan_arenas`` removes
the files of dead pids (a process killed with -9).
"""
from __future__ import annotations

import mmap
import os
import re
import stat
import uuid
import weakref
from collections import OrderedDict
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "sparkflow-arena-"
SLOT_SLACK = 64 * 1024  # IPC metadata, schema message and padding on top of bufferSize
_NAME = re.compile(rf"{PREFIX}(\d+)-[0-9a-f]+")
# map every page at once: one call instead of a page fault per 4 KiB on first touch


class ArenaError(RuntimeError):
    """An arena could not be created or mapped; the caller falls back to pushing over the socket."""


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _own_name() -> Path:
    """A fresh arena name carrying this process's pid (the one a sweep checks)."""
    return SHM_DIR / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _open_arena(path: str, flags: int) -> int:
    """Open an arena someone else named, refusing anything that is not one of ours in /dev/shm."""
    p = Path(path)
    if p.parent != SHM_DIR or not _NAME.fullmatch(p.name):
        raise ArenaError(f"{path!r} is not a sparkflow-exchange arena in {SHM_DIR}")
    try:
        return os.open(p, flags | os.O_NOFOLLOW)
    except OSError as exc:
        raise ArenaError(f"cannot open shared-memory arena {path}: {exc}") from None


class SharedArena:
    def __init__(self, path: Path, slots: int, slot_size: int, mapping: mmap.mmap, fd: int | None = None) -> None:
        self.path = path
        self.slots = slots
        self.slot_size = slot_size
        self._view = memoryview(mapping)  # keeps the mapping alive as long as any slice of it
        self._fd = fd  # the writer's: slots are reserved on first use
        self._reserved: set[int] = set()
        if fd is not None:
            weakref.finalize(self, os.close, fd)

    @classmethod
    def create(cls, slots: int, slot_size: int) -> "SharedArena":
        """The writer's side: a new file of ``slots`` x ``slot_size`` bytes, its memory reserved now."""
        path = _own_name()
        size = slots * slot_size
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ArenaError(f"cannot create shared-memory arena {path}: {exc}") from None
        try:
            # a sparse file: a slot's pages are reserved (posix_fallocate) when the writer first uses it, so a
            # Spark task that writes 1 MiB does not zero and map bufferSize x buffersPerPartition (17 MiB:
            # about 40 ms per task, most of a small task's cost), and a full /dev/shm still fails as an
            # ArenaError at that reservation, never as SIGBUS on a write into the mapping
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise ArenaError(f"cannot create {size} bytes of shared memory in {SHM_DIR}: {exc}") from None
        return cls(path, slots, slot_size, mapping, fd)

    @classmethod
    def attach(cls, path: str, slots: int, slot_size: int) -> "SharedArena":
        """The service's side: map a writer's arena and take over its name (renamed to this pid)."""
        if slots < 1 or slot_size < 1:
            raise ArenaError(f"arena {path} announced {slots} slots of {slot_size} bytes")
        fd = _open_arena(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < slots * slot_size:
                raise ArenaError(f"arena {path} holds {size} bytes, fewer than {slots} slots of {slot_size}")
            mapping = mmap.mmap(fd, slots * slot_size, flags=mmap.MAP_SHARED)  # pages fault in as slots are read
        except OSError as exc:
            raise ArenaError(f"cannot map shared-memory arena {path}: {exc}") from None
        finally:
            os.close(fd)
        owned = _own_name()
        try:
            os.rename(path, owned)
        except OSError as exc:
            raise ArenaError(f"cannot take over shared-memory arena {path}: {exc}") from None
        return cls(owned, slots, slot_size, mapping)

    def slot(self, index: int) -> memoryview:
        """Slot ``index``; on the writer's side its memory is reserved the first time (ArenaError if /dev/shm is full)."""
        start = index * self.slot_size
        if self._fd is not None and index not in self._reserved:
            try:
                os.posix_fallocate(self._fd, start, self.slot_size)
            except OSError as exc:
                raise ArenaError(f"cannot reserve {self.slot_size} bytes of shared memory in {SHM_DIR} for "
                                 f"slot {index} of {self.path}: {exc} (free /dev/shm or set sharedMemory=false)") from None
            self._reserved.add(index)
        return self._view[start:start + self.slot_size]

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)


class ArenaReader:
    """A local reader's open arenas: buffers are copied out with ``preadv`` straight from tmpfs.

    One kernel copy into the reader's own (pooled) buffer: no mapping to set up or fault in.
    At most ``MAX_OPEN`` arena files stay open, least recently used closed first: a gate reading
    hundreds of writers on this host must not hold an fd per writer for its whole life. A slot is
    read only while pinned for this reader, so its arena's name is there to reopen, unless the
    partition was released meanwhile: then the copy fails, as the read would anyway.
    """

    MAX_OPEN = 8

    def __init__(self, max_open: int = MAX_OPEN) -> None:
        self.max_open = max(1, max_open)
        self._fds: OrderedDict[str, int] = OrderedDict()

    def copy_out(self, path: str, offset: int, length: int, into: bytearray | memoryview) -> memoryview:
        """Copy one buffer out of its slot into ``into``; the slot may be refilled once this returns."""
        fd = self._fds.get(path)
        if fd is None:
            while len(self._fds) >= self.max_open:
                os.close(self._fds.popitem(last=False)[1])
            fd = self._fds[path] = _open_arena(path, os.O_RDONLY)
        else:
            self._fds.move_to_end(path)
        target = memoryview(into)[:length]
        done = 0
        while done < length:
            n = os.preadv(fd, [target[done:]], offset + done)
            if n <= 0:
                raise ArenaError(f"shared buffer at {offset}+{length} lies outside arena {path}")
            done += n
        return target

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def sweep_orphan_arenas() -> list[Path]:
    """Remove this user's arena files whose responsible process (writer or service) is gone."""
    from ..pids import pid_alive

    removed = []
    if not SHM_DIR.is_dir():
        return removed
    for entry in SHM_DIR.glob(f"{PREFIX}*"):
        m = _NAME.fullmatch(entry.name)
        try:
            st = entry.lstat()  # a link is never followed, and never ours to remove
            if not m or not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or pid_alive(int(m.group(1))):
                continue
            entry.unlink()
        except OSError:  # gone meanwhile, or not ours to remove: the sweep goes on
            continue
        removed.append(entry)
    return removed
