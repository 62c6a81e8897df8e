"""A stream's readers: consumer groups, how far each has read, and what a micro-batch may read next.

A reader query joins the stream as a consumer group (a new group starts at its ``startingEpochs``), asks
for the newest committed epoch its next micro-batch may read (admission control by epochs, rows and
bytes; a long poll woken by the commit), plans the epochs' reads, and commits the group's position;
an epoch every group is done with is released (``streams.py``). Runs on the service's event loop.
"""
from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Protocol

from ..errors import ErrorCode, ServiceError
from .stream_model import STARTS, Group, Stream

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .subscriptions import Subscriptions


class Streams(Protocol):
    """What the groups use of the stream registry (``streams.py``)."""

    streams: dict[str, Stream]
    coordinator: Coordinator
    subscriptions: Subscriptions

    def get(self, name: str) -> Stream: ...

    async def release_consumed(self, st: Stream) -> None: ...

    async def notify(self) -> None: ...


class StreamGroups:
    def __init__(self, registry: Streams, max_groups_per_owner: int = 0) -> None:
        """``max_groups_per_owner``: consumer groups one application credential may own at once, over every
        stream (maxGroupsPerCredential; 0: no cap; the operator has none): each one holds epochs back and
        is listed to everyone."""
        self.registry = registry
        self.max_groups_per_owner = max_groups_per_owner

    async def join(self, name: str, group: str | None = None, start: str = "earliest", owner: str = "") -> dict:
        """A reader query starts without a checkpoint: its group's position (a new group starts at ``start``)."""
        st = self.registry.get(name)
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
        owned = sum(1 for s in self.registry.streams.values() for g in s.groups.values() if g.owner == owner)
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
        st = self.registry.get(name)
        g = self._touch(st, group, after, owner)
        self._check_retained(st, after)
        if after > g.position:
            # Spark asks from the end of its last batch, which is done and in its commit log (a batch that is
            # not gets re-run from the offset log first, without asking): the group is done with ``after``.
            # Its commit(end) comes only when the next batch starts, so epochs would stay retained while idle.
            g.position = after
            await self.registry.release_consumed(st)
            await self.registry.notify()
        if wait > 0 and st.last_committed <= after and (upto is None or upto > after):
            # after the release above: a writer waiting for room (maxRetainedBytes) must not wait on this wait
            await self.registry.subscriptions.wait_for(
                lambda: st.last_committed > after or self.registry.streams.get(name) is not st, wait)
            st = self.registry.get(name)  # dropped meanwhile: the reader learns it now
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
        st = self.registry.get(name)
        self._check_retained(st, after)
        plans = []
        for n, e in st.epochs.items():
            if after < n <= upto and e.exchange:
                ex = self.registry.coordinator.exchanges.get(e.exchange)
                if ex is None:
                    raise ServiceError(f"stream {name!r}: epoch {n} is gone (its exchange was dropped)", ErrorCode.EXCHANGE_LOST)
                desc = ex.describe()
                desc.pop("schema", None)
                plans.append({"epoch": n, "rows": e.rows, "desc": desc})
        return {"epochs": plans, "num_subpartitions": st.num_subpartitions, "schema": st.schema}

    async def commit_group(self, name: str, group: str, epoch: int, owner: str = "") -> dict:
        """A reader query is done with every epoch up to ``epoch``: what every group is done with is released."""
        st = self.registry.get(name)
        g = self._touch(st, group, epoch, owner)
        g.position = max(g.position, epoch)
        g.confirmed = True
        await self.registry.release_consumed(st)
        await self.registry.notify()
        return {"group": group, "position": g.position, "released_upto": st.released_upto}

    async def leave(self, name: str, group: str) -> dict:
        """Forget a consumer group (it no longer holds epochs back)."""
        st = self.registry.get(name)
        found = st.groups.pop(group, None) is not None
        await self.registry.release_consumed(st)
        await self.registry.notify()
        return {"left": found}
