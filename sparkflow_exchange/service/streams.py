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

import logging
import time

from ..errors import ErrorCode, ServiceError
from ..kinds import RE_READABLE, PartitionState
from .coordinator import Coordinator
from .exchange_lifecycle import Event
from .exchanges import EVERYONE, FORWARD_LIKE, checked_readers, same_schema
from .stream_groups import StreamGroups
from .stream_model import UNCONFIRMED_GRACE, Epoch, Group, OpenEpoch, Stream, epoch_exchange

log = logging.getLogger(__name__)

class StreamRegistry:
    """Streams, their epochs and consumer groups, over the coordinator's exchanges."""

    def __init__(self, coordinator: Coordinator, ttl: float = 3600.0, unconfirmed_grace: float = UNCONFIRMED_GRACE,
                 max_groups_per_owner: int = 0) -> None:
        """``max_groups_per_owner``: consumer groups one application credential may own at once, over every
        stream (maxGroupsPerCredential; 0: no cap; the operator has none): each one holds epochs back and
        is listed to everyone."""
        self.coordinator = coordinator
        self.ttl = ttl
        self.unconfirmed_grace = unconfirmed_grace
        self.streams: dict[str, Stream] = {}
        # one condition: a read waiting for a batch exchange sees a stream too
        self.subscriptions = coordinator.subscriptions
        coordinator.attach_streams(self)
        self.groups = StreamGroups(self, max_groups_per_owner)  # the readers' consumer groups

    def is_stream(self, name: str) -> bool:
        return name in self.streams

    def owned_by(self, owner: str) -> int:
        """Streams the credential owns (they count against its exchanges)."""
        return sum(1 for st in self.streams.values() if st.owner == owner)

    def get(self, name: str) -> Stream:
        st = self.streams.get(name)
        if st is None:
            if name in self.coordinator.exchanges:
                raise ServiceError(f"exchange {name!r} was written by a batch job, not a streaming query: read it with "
                               "spark.read, or write the stream to another name", ErrorCode.NOT_A_STREAM)
            raise ServiceError(f"stream {name!r} does not exist (no streaming query has written to it; check the name, "
                           "or raise declareTimeout)", ErrorCode.NO_EXCHANGE)
        return st

    async def notify(self) -> None:
        await self.subscriptions.wake()

    # ------------------------------------------------------------ writer query
    async def declare(self, name: str, schema: str, num_subpartitions: int | None, partitioner: dict,
                      partition_type: str, coalesce: bool = False, max_retained_bytes: int = 0,
                      groups: list[str] | None = None, owner: str = "", readers: list[str] | None = None) -> dict:
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
            self.coordinator.book.check_room(owner, name, "stream")
            st = self.streams[name] = Stream(name, schema, partitioner, partition_type, num_subpartitions,
                                             bool(coalesce) and num_subpartitions is None, owner=owner,
                                             readers=checked_readers(readers) if readers
                                             else self.coordinator.writes.default_readers)
            self.coordinator.lost.pop(name, None)
        else:
            self._check_same(st, schema, num_subpartitions, partitioner, partition_type)
            if readers and checked_readers(readers) != st.readers:
                raise ServiceError(f"stream {name!r} is read by {','.join(st.readers)}; a writer query that starts "
                                   f"again keeps its readers (this one names {','.join(readers)}): drop the stream "
                                   "to change them", ErrorCode.BAD_REQUEST)
            st.life.on(Event.OPEN_WRITE)
        st.written = time.monotonic()
        st.max_retained_bytes = max(0, int(max_retained_bytes or 0))
        for group in groups or ():
            if group not in st.groups:
                st.groups[group] = Group(group, st.released_upto, confirmed=True, owner=st.owner)
        await self.notify()
        return st.describe()

    @staticmethod
    def _check_same(st: Stream, schema: str, num_subpartitions: int | None, partitioner: dict,
                    partition_type: str) -> None:
        """A writer query that starts again writes the stream as it was declared."""
        name = st.name
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

    async def begin_epoch(self, name: str, epoch: int, query: str, run: str, wait: float = 0.0) -> dict:
        """A write task of micro-batch ``epoch`` starts: skip (committed already), wait (backpressure), or write.

        ``query``: the writer query's id (kept across restarts from its checkpoint); ``run``: a token of one
        start of it (the writer its tasks were given). Runs are ordered by when the service first saw them:
        a later run replaces an epoch an earlier one left open, never the reverse (a task of a stopped run
        may still be starting when the restarted query replays the batch). Spark may give commit and abort
        another writer object than the tasks, so those name no run; a query is stopped, its abort done,
        before it can start again.
        Returns ``{"skip": True}``, ``{"waiting": ...}`` (call again) or the epoch exchange to write."""
        st = self.get(name)
        st.written = time.monotonic()
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
                await self.drop_epoch_exchange(op.exchange, "replaced: the writer query replays its micro-batch")
                del st.open[epoch]
                op = None
            if op is None:
                ename = epoch_exchange(name, epoch)
                desc = await self.coordinator.writes.declare_epoch(
                    name, ename, st.schema, st.num_subpartitions, st.partitioner, st.partition_type,
                    coalesce=st.coalesce and st.num_subpartitions is None, owner=st.owner, readers=st.readers)
                op = st.open[epoch] = OpenEpoch(epoch, order, ename, desc["epoch"], desc["write_id"])
        return {"exchange": op.exchange, "generation": op.generation, "write_id": op.write_id,
                "num_subpartitions": st.num_subpartitions, "schema": st.schema, "readers": list(st.readers),
                "private": EVERYONE not in st.readers}

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
        if wait > 0 and await self.subscriptions.wait_for(fits, wait):
            st.waiting_since = None
            return True
        return False

    async def commit_epoch(self, name: str, epoch: int, partitions: list[str],
                           rows: dict[str, int] | None = None) -> dict:
        """Micro-batch ``epoch`` committed by Spark: seal its producers. A replay of a committed one changes nothing."""
        st = self.get(name)
        st.written = time.monotonic()
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
            await self.drop_epoch_exchange(st.open.pop(old).exchange, "abandoned by the writer query")
        st.epochs[epoch] = record
        st.last_committed = epoch
        await self.release_consumed(st)
        await self.notify()
        return {"committed": epoch, "rows": record.rows, "bytes": record.bytes}

    async def abort_epoch(self, name: str, epoch: int, reason: str = "") -> dict:
        """Spark aborted micro-batch ``epoch``: drop what was written of it."""
        st = self.streams.get(name)
        op = st.open.pop(epoch, None) if st is not None else None
        if op is not None:
            await self.drop_epoch_exchange(op.exchange, f"its micro-batch was aborted ({reason or 'failed'})")
        return {"ok": True}

    async def drop_epoch_exchange(self, ename: str, reason: str) -> None:
        if ename and ename in self.coordinator.exchanges:
            await self.coordinator.writes.discard(ename, reason)

    # ------------------------------------------------------------ readers
    async def describe(self, name: str, wait: float = 0.0) -> dict:
        """The stream, waiting up to ``wait`` s for a writer query to declare it."""
        if name not in self.streams and wait > 0 and name not in self.coordinator.exchanges:
            await self.subscriptions.wait_for(lambda: name in self.streams, wait)
        return self.get(name).describe()

    async def release_consumed(self, st: Stream) -> None:
        if not st.groups:
            return  # nobody registered yet: keep every epoch for the first reader (bounded by maxRetainedBytes, ttl)
        low = min(min(g.position for g in st.groups.values()), st.last_committed)
        for n in [n for n in st.epochs if n <= low]:
            await self.drop_epoch_exchange(st.epochs.pop(n).exchange, "consumed by every consumer group")
        st.released_upto = max(st.released_upto, low)

    # ------------------------------------------------------------ housekeeping
    async def drop(self, name: str) -> dict:
        return await self._end(self.get(name), Event.RELEASE, "dropped")

    async def _end(self, st: Stream, event: Event, reason: str) -> dict:
        """Drop or expire a stream as its lifecycle says: its epochs (committed and open) go with it."""
        st.life.on(event, reason=reason)
        del self.streams[st.name]
        for e in list(st.epochs.values()):
            await self.drop_epoch_exchange(e.exchange, reason)
        for op in list(st.open.values()):
            await self.drop_epoch_exchange(op.exchange, reason)
        await self.notify()
        return {"dropped": st.name, "epochs": len(st.epochs)}

    def _unused(self, st: Stream, now: float) -> bool:
        """Nobody used the stream for ``ttl`` (no writer call, commit or reader) and no task is writing it."""
        if self.ttl <= 0 or now - st.last_used() <= self.ttl:
            return False
        for op in st.open.values():
            ex = self.coordinator.exchanges.get(op.exchange)
            if ex is not None and (now - ex.last_used <= self.ttl or
                                   any(p.state == PartitionState.RUNNING for p in ex.producers.values())):
                return False
        return True

    async def expire(self) -> None:
        """Idle groups are forgotten (after ``ttl``; one that never planned a batch after a short grace) and
        epochs older than ``ttl`` released: a reader gone for good holds nothing for ever. A stream nobody used
        for ``ttl`` is dropped, as an exchange expires (a writer query that comes back later starts it again)."""
        now = time.monotonic()
        for st in list(self.streams.values()):
            if self._unused(st, now):
                log.info("stream %s: unused for %.0f s, dropped (ttl=%g s)", st.name, now - st.last_used(), self.ttl)
                await self._end(st, Event.EXPIRE, f"expired (unused for ttl={self.ttl:g} s)")
                continue
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
                    await self.drop_epoch_exchange(st.epochs.pop(n).exchange, f"expired (ttl={self.ttl:g} s)")
                    st.released_upto = max(st.released_upto, n)
                    changed = True
            if changed:
                await self.release_consumed(st)
                await self.notify()

    def list(self) -> list[dict]:
        return [st.describe() for st in self.streams.values()]
