"""The stream role: an exchange written by a streaming query, one epoch per micro-batch.

An epoch (the writer query's ``batchId``) is an exchange of its own in the coordinator, named
``<stream>#<epoch>`` and left out of listings: declare, register, commit and release are the batch
ones, so every selector, partition type, channel and integrity check works for streams unchanged.
What a stream adds lives here:

- which epochs are committed (a replayed batch id is skipped, an uncommitted one is replaced);
- consumer groups and how far each has read (an epoch is released once every group is past it);
- the writer's wait while the retained bytes exceed ``stream.maxRetainedBytes`` (backpressure between
  two queries, which Kafka does not give).
Everything runs on the service's event loop, as the coordinator does.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import ErrorCode, ServiceError
from ..kinds import RE_READABLE, ExchangeState
from .clock import wall_time
from .coordinator import FORWARD_LIKE, Coordinator, same_schema

log = logging.getLogger(__name__)

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
    created: float = field(default_factory=time.time)  # wall clock: when a writer query first declared it

    def retained_bytes(self) -> int:
        return sum(e.bytes for e in self.epochs.values())

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        used = max([e.committed_at for e in self.epochs.values()] + [g.seen for g in self.groups.values()], default=None)
        return {
            "name": self.name, "kind": "stream", "schema": self.schema, "partitioner": self.partitioner,
            "partition_type": self.partition_type, "num_subpartitions": self.num_subpartitions,
            "coalesce": self.coalesce, "state": ExchangeState.STREAMING, "writer_query": self.writer_query, "owner": self.owner,
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


class StreamRegistry:
    """Streams, their epochs and consumer groups, over the coordinator's exchanges."""

    def __init__(self, coordinator: Coordinator, ttl: float = 3600.0, unconfirmed_grace: float = UNCONFIRMED_GRACE,
                 max_groups_per_owner: int = 0) -> None:
        """``max_groups_per_owner``: consumer groups one application credential may own at once, over every
        stream (maxGroupsPerCredential; 0: no cap; the operator has none): each one holds epochs back and
        is listed to everyone."""
        self.coordinator = coordinator
        self.max_groups_per_owner = max_groups_per_owner
        self.ttl = ttl
        self.unconfirmed_grace = unconfirmed_grace
        self.streams: dict[str, Stream] = {}
        self._changed = coordinator._changed  # one condition: a read waiting for a batch exchange sees a stream too
        coordinator.is_stream = lambda name: name in self.streams
        coordinator.streams_of = lambda owner: sum(1 for st in self.streams.values() if st.owner == owner)

    def _get(self, name: str) -> Stream:
        st = self.streams.get(name)
        if st is None:
            if name in self.coordinator.exchanges:
                raise ServiceError(f"exchange {name!r} was written by a batch job, not a streaming query: read it with "
                               "spark.read, or write the stream to another name", ErrorCode.NOT_A_STREAM)
            raise ServiceError(f"stream {name!r} does not exist (no streaming query has written to it; check the name, "
                           "or raise declareTimeout)", ErrorCode.NO_EXCHANGE)
        return st

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------ writer query
    async def declare(self, name: str, schema: str, num_subpartitions: int | None, partitioner: dict,
                      partition_type: str, coalesce: bool = False, max_retained_bytes: int = 0,
                      groups: list[str] | None = None, owner: str = "") -> dict:
        """A writer query starts (or restarts): create the stream, or check it still matches.

        ``groups``: consumer groups known in advance; each is registered (if new) before anything is
        released, so it reads every epoch from the stream's start however late its reader starts."""
        if not name:
            raise ServiceError("the 'exchange' option is required (the name of the stream)", ErrorCode.BAD_REQUEST)
        if name in self.coordinator.exchanges:
            raise ServiceError(f"exchange {name!r} holds a batch write; a streaming query cannot write it: use another "
                           "name, or drop the exchange first", ErrorCode.BAD_REQUEST)
        if partition_type not in RE_READABLE:
            raise ServiceError(f"a streaming write needs a re-readable partitionType (HYBRID or BLOCKING), not "
                           f"{partition_type}: a restarted reader reads its last epoch again; bound what a stream "
                           "keeps with stream.maxRetainedBytes", ErrorCode.BAD_REQUEST)
        if partitioner.get("name") in FORWARD_LIKE and num_subpartitions is None:
            raise ServiceError(f"a streaming {partitioner.get('name')} write needs numSubpartitions: every epoch of a "
                           "stream is read with the same number of partitions", ErrorCode.BAD_REQUEST)
        st = self.streams.get(name)
        if st is None:
            self.coordinator.check_room(owner, name, "stream")
            st = self.streams[name] = Stream(name, schema, partitioner, partition_type, num_subpartitions,
                                             bool(coalesce) and num_subpartitions is None, owner=owner)
            self.coordinator.lost.pop(name, None)
        else:
            if not same_schema(st.schema, schema):
                raise ServiceError(f"stream {name!r} has another schema than this writer query's; write to another "
                               "name, or drop the stream first", ErrorCode.SCHEMA_MISMATCH)
            if partitioner.get("name") != st.partitioner.get("name") or list(partitioner.get("keys", ())) != \
                    list(st.partitioner.get("keys", ())) or partition_type != st.partition_type:
                raise ServiceError(f"stream {name!r} is written with partitioner {st.partitioner.get('name')!r} keys "
                               f"{list(st.partitioner.get('keys', ()))} partitionType {st.partition_type}; a writer "
                               "query must keep them", ErrorCode.BAD_REQUEST)
            if num_subpartitions is not None and st.num_subpartitions not in (None, num_subpartitions):
                raise ServiceError(f"stream {name!r} has {st.num_subpartitions} subpartitions; this writer query asks "
                               f"for {num_subpartitions}", ErrorCode.BAD_REQUEST)
        st.max_retained_bytes = max(0, int(max_retained_bytes or 0))
        for group in groups or ():
            if group not in st.groups:
                st.groups[group] = Group(group, st.released_upto, confirmed=True, owner=st.owner)
        await self._notify()
        return st.describe()

    async def begin_epoch(self, name: str, epoch: int, query: str, run: str, wait: float = 0.0) -> dict:
        """A write task of micro-batch ``epoch`` starts: skip (committed already), wait (backpressure), or write.

        ``query``: the writer query's id (kept across restarts from its checkpoint); ``run``: a token of one
        start of it (the writer its tasks were given). Runs are ordered by when the service first saw them:
        a later run replaces an epoch an earlier one left open, never the reverse (a task of a stopped run
        may still be starting when the restarted query replays the batch). Spark may give commit and abort
        another writer object than the tasks, so those name no run; a query is stopped, its abort done,
        before it can start again.
        Returns ``{"skip": True}``, ``{"waiting": ...}`` (call again) or the epoch exchange to write."""
        st = self._get(name)
        if st.writer_query is None:
            st.writer_query = query
        elif query != st.writer_query:
            raise ServiceError(
                f"stream {name!r} is written by streaming query {st.writer_query}; query {query} cannot write it too "
                "(a query started from a new checkpoint numbers its batches from 0 again, which the stream would "
                "take for replays): write to another exchange name, or drop the stream first", ErrorCode.BAD_REQUEST)
        if epoch <= st.last_committed:
            return {"skip": True, "last_committed": st.last_committed}
        if not await self._room(st, wait):
            return {"waiting": st.describe()}
        if self.streams.get(name) is not st:
            raise ServiceError(f"stream {name!r} was dropped while micro-batch {epoch} waited to write", ErrorCode.NO_EXCHANGE)
        async with st.lock:
            order = st.runs.setdefault(run, len(st.runs))
            op = st.open.get(epoch)
            if op is not None and order < op.run:
                raise ServiceError(f"micro-batch {epoch} of stream {name!r} belongs to a later start of the writer "
                               "query; this task's run was stopped", ErrorCode.SUPERSEDED)
            if op is not None and op.run != order:  # a restarted query replays a batch that never committed
                log.warning("stream %s: epoch %d left open by run %d is replaced by run %d (%s)", name, epoch,
                            op.run, order, run)
                await self._drop_epoch_exchange(op.exchange, "replaced: the writer query replays its micro-batch")
                del st.open[epoch]
                op = None
            if op is None:
                ename = epoch_exchange(name, epoch)
                desc = await self.coordinator.declare(
                    ename, st.schema, st.num_subpartitions, st.partitioner, st.partition_type, "overwrite",
                    coalesce=st.coalesce and st.num_subpartitions is None, owner=st.owner)
                self.coordinator.exchanges[ename].stream = name
                op = st.open[epoch] = OpenEpoch(epoch, order, ename, desc["epoch"], desc["write_id"])
        return {"exchange": op.exchange, "generation": op.generation, "write_id": op.write_id,
                "num_subpartitions": st.num_subpartitions, "schema": st.schema}

    async def _room(self, st: Stream, wait: float) -> bool:
        """Backpressure: True when the stream keeps at most maxRetainedBytes (waiting up to ``wait`` s for it)."""
        def fits() -> bool:
            return not st.max_retained_bytes or st.retained_bytes() <= st.max_retained_bytes or \
                self.streams.get(st.name) is not st
        if fits():
            st.waiting_since = None
            return True
        if st.waiting_since is None:
            st.waiting_since = time.monotonic()
        if wait > 0:
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(fits), wait)
            except asyncio.TimeoutError:
                return False
            st.waiting_since = None
            return True
        return False

    async def commit_epoch(self, name: str, epoch: int, partitions: list[str],
                           rows: dict[str, int] | None = None) -> dict:
        """Micro-batch ``epoch`` committed by Spark: seal its producers. A replay of a committed one changes nothing."""
        st = self._get(name)
        if epoch <= st.last_committed:
            return {"skipped": True, "last_committed": st.last_committed}
        op = st.open.get(epoch)
        if op is None:
            if partitions:
                raise ServiceError(f"commit of epoch {epoch} of stream {name!r} names producers, but the epoch is not "
                               "being written (replaced by a newer run of the writer query?)", ErrorCode.WRITE_CLOSED)
            record = Epoch(epoch, "", 0, 0)
        else:
            desc = await self.coordinator.commit(op.exchange, op.generation, op.write_id, partitions, rows)
            del st.open[epoch]
            committed = set(desc["committed"])
            size = sum(max(p.get("bytes", 0), 0) for p in desc["producers"] if p["partition"] in committed)
            record = Epoch(epoch, op.exchange, desc["rows"] if desc["rows"] is not None else -1, size)
            if st.num_subpartitions is None:
                st.num_subpartitions = desc["num_subpartitions"]
        for old in [n for n in st.open if n < epoch]:  # batches abandoned by a failed run: never read
            await self._drop_epoch_exchange(st.open.pop(old).exchange, "abandoned by the writer query")
        st.epochs[epoch] = record
        st.last_committed = epoch
        await self._release(st)
        await self._notify()
        return {"committed": epoch, "rows": record.rows, "bytes": record.bytes}

    async def abort_epoch(self, name: str, epoch: int, reason: str = "") -> dict:
        """Spark aborted micro-batch ``epoch``: drop what was written of it."""
        st = self.streams.get(name)
        op = st.open.pop(epoch, None) if st is not None else None
        if op is not None:
            await self._drop_epoch_exchange(op.exchange, f"its micro-batch was aborted ({reason or 'failed'})")
        return {"ok": True}

    async def _drop_epoch_exchange(self, ename: str, reason: str) -> None:
        if ename and ename in self.coordinator.exchanges:
            await self.coordinator._drop(ename, reason)

    # ------------------------------------------------------------ reader queries
    async def describe(self, name: str, wait: float = 0.0) -> dict:
        """The stream, waiting up to ``wait`` s for a writer query to declare it."""
        if name not in self.streams and wait > 0 and name not in self.coordinator.exchanges:
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(lambda: name in self.streams), wait)
            except asyncio.TimeoutError:
                pass
        return self._get(name).describe()

    async def join(self, name: str, group: str | None = None, start: str = "earliest", owner: str = "") -> dict:
        """A reader query starts without a checkpoint: its group's position (a new group starts at ``start``)."""
        st = self._get(name)
        if start not in STARTS:
            raise ServiceError(f"unknown startingEpochs {start!r}; use earliest or latest", ErrorCode.BAD_REQUEST)
        if group and group in st.groups:
            g = st.groups[group]
            g.seen = time.monotonic()
            return {"group": g.name, "position": g.position}
        name_of_group = group or f"query-{uuid.uuid4().hex[:12]}"
        position = st.released_upto if start == "earliest" else st.last_committed
        self._check_room(owner, name_of_group, st)
        st.groups[name_of_group] = Group(name_of_group, position, owner=owner)
        return {"group": name_of_group, "position": position}

    def _touch(self, st: Stream, group: str, after: int, owner: str = "") -> Group:
        """The group, registered again at ``after`` when the service no longer knows it (expired, restarted)."""
        g = st.groups.get(group)
        if g is None:
            self._check_retained(st, after)
            self._check_room(owner, group, st)
            g = st.groups[group] = Group(group, after, owner=owner)
        g.seen = time.monotonic()
        return g

    def _check_room(self, owner: str, group: str, st: Stream) -> None:
        """Refuse a new group of ``owner`` that owns as many as one credential may."""
        from ..network.auth import OPERATOR

        if not owner or owner == OPERATOR or not self.max_groups_per_owner:
            return
        owned = sum(1 for s in self.streams.values() for g in s.groups.values() if g.owner == owner)
        if owned >= self.max_groups_per_owner:
            raise ServiceError(f"joining stream {st.name!r} as consumer group {group!r} is refused: credential "
                               f"{owner!r} owns {owned} consumer groups, and one application credential may own at "
                               f"most maxGroupsPerCredential={self.max_groups_per_owner}; leave groups it no longer "
                               "reads with (sparkflow_exchange.leave_group)", ErrorCode.LIMIT)

    @staticmethod
    def _check_retained(st: Stream, after: int) -> None:
        if after < st.released_upto:
            raise ServiceError(
                f"stream {st.name!r}: epochs {after + 1}..{st.released_upto} were released before this reader read "
                "them (every consumer group had committed past them, or ttl expired): those rows are lost for it; "
                "start the query from a new checkpoint, or give it its own consumerGroup from the start",
                ErrorCode.EXCHANGE_LOST)

    async def latest(self, name: str, group: str, after: int, max_epochs: int | None = None,
                     max_rows: int | None = None, max_bytes: int | None = None, upto: int | None = None,
                     wait: float = 0.0, owner: str = "") -> dict:
        """The newest committed epoch a micro-batch starting after ``after`` may read (admission control:
        at least one epoch when any is there, then as many as the limits allow).

        ``wait``: with nothing new, wait up to this long for the next commit (a long poll: an idle reader
        query starts its batch within milliseconds of the writer's commit instead of polling)."""
        st = self._get(name)
        g = self._touch(st, group, after, owner)
        self._check_retained(st, after)
        if after > g.position:
            # Spark asks from the end of its last batch, which is done and in its commit log (a batch that is
            # not gets re-run from the offset log first, without asking): the group is done with ``after``.
            # Its commit(end) comes only when the next batch starts, so epochs would stay retained while idle.
            g.position = after
            await self._release(st)
            await self._notify()
        if wait > 0 and st.last_committed <= after and (upto is None or upto > after):
            # after the release above: a writer waiting for room (maxRetainedBytes) must not wait on this wait
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(
                        lambda: st.last_committed > after or self.streams.get(name) is not st), wait)
            except asyncio.TimeoutError:
                pass
            st = self._get(name)  # dropped meanwhile: the reader learns it now
        end, epochs, rows, size = after, 0, 0, 0
        for n, e in st.epochs.items():
            if n <= after or (upto is not None and n > upto):
                continue
            if epochs and ((max_epochs and epochs + 1 > max_epochs) or (max_rows and rows + max(e.rows, 0) > max_rows)
                           or (max_bytes and size + e.bytes > max_bytes)):
                break
            end, epochs, rows, size = n, epochs + 1, rows + max(e.rows, 0), size + e.bytes
        if end > after:
            g.confirmed = True  # Spark writes this batch to its offset log, the group with it
        return {"epoch": end, "last_committed": st.last_committed}

    async def plan(self, name: str, after: int, upto: int) -> dict:
        """Read plans of the committed epochs in (after, upto], in order: each a sealed exchange's description."""
        st = self._get(name)
        self._check_retained(st, after)
        plans = []
        for n, e in st.epochs.items():
            if after < n <= upto and e.exchange:
                ex = self.coordinator.exchanges.get(e.exchange)
                if ex is None:
                    raise ServiceError(f"stream {name!r}: epoch {n} is gone (its exchange was dropped)", ErrorCode.EXCHANGE_LOST)
                desc = ex.describe()
                desc.pop("schema", None)
                plans.append({"epoch": n, "rows": e.rows, "desc": desc})
        return {"epochs": plans, "num_subpartitions": st.num_subpartitions, "schema": st.schema}

    async def commit_group(self, name: str, group: str, epoch: int, owner: str = "") -> dict:
        """A reader query is done with every epoch up to ``epoch``: what every group is done with is released."""
        st = self._get(name)
        g = self._touch(st, group, epoch, owner)
        g.position = max(g.position, epoch)
        g.confirmed = True
        await self._release(st)
        await self._notify()
        return {"group": group, "position": g.position, "released_upto": st.released_upto}

    async def leave(self, name: str, group: str) -> dict:
        """Forget a consumer group (it no longer holds epochs back)."""
        st = self._get(name)
        found = st.groups.pop(group, None) is not None
        await self._release(st)
        await self._notify()
        return {"left": found}

    async def _release(self, st: Stream) -> None:
        if not st.groups:
            return  # nobody registered yet: keep every epoch for the first reader (bounded by maxRetainedBytes, ttl)
        low = min(min(g.position for g in st.groups.values()), st.last_committed)
        for n in [n for n in st.epochs if n <= low]:
            await self._drop_epoch_exchange(st.epochs.pop(n).exchange, "consumed by every consumer group")
        st.released_upto = max(st.released_upto, low)

    # ------------------------------------------------------------ housekeeping
    async def drop(self, name: str) -> dict:
        st = self.streams.pop(name)
        for e in list(st.epochs.values()):
            await self._drop_epoch_exchange(e.exchange, "dropped")
        for op in list(st.open.values()):
            await self._drop_epoch_exchange(op.exchange, "dropped")
        await self._notify()
        return {"dropped": name, "epochs": len(st.epochs)}

    async def expire(self) -> None:
        """Idle groups are forgotten (after ``ttl``; one that never planned a batch after a short grace) and
        epochs older than ``ttl`` released: a reader gone for good holds nothing for ever. The stream itself
        stays until dropped (its writer query may come back)."""
        now = time.monotonic()
        for st in list(self.streams.values()):
            changed = False
            for g in list(st.groups.values()):
                limit = self.unconfirmed_grace if not g.confirmed else self.ttl
                if self.ttl > 0 and not g.confirmed:
                    limit = min(limit, self.ttl)
                if limit > 0 and now - g.seen > limit:
                    log.warning("stream %s: consumer group %s idle for %.0f s, forgotten", st.name, g.name, now - g.seen)
                    del st.groups[g.name]
                    changed = True
            for n, e in list(st.epochs.items()):
                if self.ttl > 0 and now - e.committed_at > self.ttl:
                    await self._drop_epoch_exchange(st.epochs.pop(n).exchange, f"expired (ttl={self.ttl:g} s)")
                    st.released_upto = max(st.released_upto, n)
                    changed = True
            if changed:
                await self._release(st)
                await self._notify()

    def list(self) -> list[dict]:
        return [st.describe() for st in self.streams.values()]
