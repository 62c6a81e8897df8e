"""A stream's model: its committed and open epochs, its consumer groups (service/streams.py changes them)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from .clock import wall_time
from .exchange_lifecycle import Kind, Lifecycle
from .exchanges import EVERYONE

STARTS = ("earliest", "latest")
# a group that never got as far as planning a micro-batch is forgotten this long after its query's last call:
# a query restarted before its first batch has no offsets in its checkpoint, so it joins as a new group
UNCONFIRMED_GRACE = 30.0


@dataclass
class Epoch:
    """A committed micro-batch, retained until every group has read it (or ``ttl``)."""

    number: int
    exchange: str  # the coordinator's exchange holding it ("" for a micro-batch that had no tasks)
    rows: int
    bytes: int
    committed_at: float = field(default_factory=time.monotonic)


@dataclass
class OpenEpoch:
    """A micro-batch being written by one run of the writer query."""

    number: int
    run: int  # the order in which the service first saw that run's token
    exchange: str
    generation: int
    write_id: str


@dataclass
class Group:
    name: str
    position: int  # the last epoch this group committed (read and done with)
    seen: float = field(default_factory=time.monotonic)
    confirmed: bool = False  # its query planned a micro-batch from it (so its checkpoint names the group)
    owner: str = ""  # the credential that joined (created) it; it, the stream's owner or the operator may move it


@dataclass
class Stream:
    name: str
    schema: str
    partitioner: dict
    partition_type: str
    num_subpartitions: int | None
    coalesce: bool
    max_retained_bytes: int = 0
    writer_query: str | None = None
    epochs: dict[int, Epoch] = field(default_factory=dict)  # committed and retained, in epoch order
    open: dict[int, OpenEpoch] = field(default_factory=dict)
    groups: dict[str, Group] = field(default_factory=dict)
    last_committed: int = -1
    released_upto: int = -1  # every epoch up to this one is released (or never existed)
    waiting_since: float | None = None  # the writer waits on maxRetainedBytes since then
    runs: dict[str, int] = field(default_factory=dict)  # a run's token -> the order the service first saw it in
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    owner: str = ""  # the credential that declared it (service/owners.py); its epochs are its too
    readers: tuple[str, ...] = (EVERYONE,)  # who may read it and join its groups besides its owner
    created: float = field(default_factory=time.time)  # wall clock: when a writer query first declared it
    written: float = field(default_factory=time.monotonic)  # the writer query's last call (declare, an epoch's)
    life: Lifecycle | None = None  # streaming until dropped or expired

    def __post_init__(self) -> None:
        if self.life is None:
            self.life = Lifecycle(self.name, Kind.STREAM)

    def last_used(self) -> float:
        """When its writer or a reader last used it (monotonic)."""
        return max([self.written, *(e.committed_at for e in self.epochs.values()),
                    *(g.seen for g in self.groups.values())])

    def retained_bytes(self) -> int:
        return sum(e.bytes for e in self.epochs.values())

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        used = max([e.committed_at for e in self.epochs.values()] + [g.seen for g in self.groups.values()], default=None)
        return {
            "name": self.name, "kind": "stream", "schema": self.schema, "partitioner": self.partitioner,
            "partition_type": self.partition_type, "num_subpartitions": self.num_subpartitions,
            "coalesce": self.coalesce, "state": self.life.state, "writer_query": self.writer_query,
            "owner": self.owner, "readers": list(self.readers), "private": EVERYONE not in self.readers,
            "last_committed": self.last_committed, "released_upto": self.released_upto,
            "retained_epochs": len(self.epochs), "retained_bytes": self.retained_bytes(),
            "retained_rows": sum(e.rows for e in self.epochs.values() if e.rows >= 0),
            "max_retained_bytes": self.max_retained_bytes,
            "writer_waiting_s": None if self.waiting_since is None else round(now - self.waiting_since, 3),
            "groups": {g.name: {"position": g.position, "idle_s": round(now - g.seen, 3), "confirmed": g.confirmed,
                                "owner": g.owner}
                       for g in self.groups.values()},
            "created_at": self.created,
            "last_used_at": self.created if used is None else wall_time(used),
        }


def epoch_exchange(stream: str, epoch: int) -> str:
    return f"{stream}#{epoch}"
