"""The coordinator's writer role: declare, register producers, finish, commit, abort and drop.

Flink's JobManager partition tracking, reduced to what a Spark write needs: the driver declares an
exchange with its schema; every task attempt registers its result partition and location; commit seals
the winning attempts; abort and drop release everything. Each step is an event of the exchange's
lifecycle (``exchange_lifecycle.py``), which refuses it in a state it is not legal in and says what
follows; this role carries out what follows on the book.
"""
from __future__ import annotations

import logging
from typing import Callable

from ..errors import ErrorCode, ServiceError
from ..kinds import ExchangeState, PartitionState, PartitionType
from ..network.auth import OPERATOR
from .exchange_book import REPLACED, ExchangeBook
from .exchange_lifecycle import Action, Event, ReplicaState, Transition
from .exchanges import (
    EVERYONE,
    Exchange,
    ProducerInfo,
    checked_readers,
    layout_text,
    same_layout,
    same_schema,
    schema_text,
)
from .write_checks import add_sizes, check_rows, check_tasks_covered, fix_width, record_sizes

log = logging.getLogger(__name__)

# (location, partition id) -> the credential that registered the partition, when the location is this process's
# service ("" when it holds no such partition); None for a location elsewhere
PartitionOwner = Callable[[dict, str], "str | None"]
# (the location of the partition to copy, or None to only check there are enough hosts; how many copies) -> the
# locations of registered services on other hosts that keep them (ServiceRoster.pick_replicas)
PickReplicas = Callable[["dict | None", int], list[dict]]


class Writes:
    def __init__(self, book: ExchangeBook, locate: Callable[[dict], dict], partition_owner: PartitionOwner,
                 pick_replicas: PickReplicas = lambda location, n: []) -> None:
        """``locate``: a producer's location as the service registry holds it (refused when no live registered
        service gave it); ``pick_replicas``: the services of other hosts that keep a partition's copies."""
        self.book = book
        self.default_readers: tuple[str, ...] = (EVERYONE,)  # the service's defaultReaders
        self.locate = locate
        self.partition_owner = partition_owner
        self.pick_replicas = pick_replicas

    async def declare(self, name: str, schema: str, num_subpartitions: int | None, partitioner: dict,
                      partition_type: str, mode: str, coalesce: bool = False, owner: str = "", replicas: int = 0,
                      readers: list[str] | None = None) -> dict:
        """Start a write: create (overwrite) or extend (append) an exchange; returns its description + write id.

        ``readers``: the credentials that may read it besides its owner and the operator (``*``: every one);
        none given: the service's ``defaultReaders``. An append keeps the exchange's readers.

        ``coalesce``: the width was not given (hash, rebalance, rescale, custom): the first producer fixes it
        when it registers, and reads of the sealed exchange may group adjacent subpartitions. ``replicas``:
        copies of each partition on other hosts; refused now when the coordinator has services on too few."""
        if not name:
            raise ServiceError("the 'exchange' option is required (the name of the exchange)", ErrorCode.BAD_REQUEST)
        if mode not in ("overwrite", "append"):
            raise ServiceError(f"unknown save mode {mode!r}", ErrorCode.BAD_REQUEST)
        if self.book.streams.is_stream(name):
            raise ServiceError(f"exchange {name!r} is a stream written by a streaming query; a batch write cannot "
                               "write it: use another name, or drop the stream first", ErrorCode.BAD_REQUEST)
        if replicas and partition_type == PartitionType.PIPELINED_BOUNDED:
            raise ServiceError("replicas needs partitionType HYBRID or BLOCKING: a PIPELINED_BOUNDED partition is "
                               "consumed once, and its copy would fill with no reader", ErrorCode.BAD_REQUEST)
        if replicas:
            self.pick_replicas(None, replicas)  # NO_REPLICA_HOST before anything is declared
        ex = self.book.exchanges.get(name)
        if ex is not None and mode == "append" and ex.state != ExchangeState.ABORTED:
            self._check_append(ex, schema, partitioner, partition_type, num_subpartitions)
            if replicas != ex.replicas:
                raise ServiceError(f"append to exchange {name!r} with replicas={replicas}: the exchange keeps "
                                   f"replicas={ex.replicas}, the count it was created with; write it with "
                                   "mode('overwrite') to change it", ErrorCode.LAYOUT_MISMATCH)
            if readers and tuple(readers) != ex.readers:
                raise ServiceError(f"append to exchange {name!r} with readers={','.join(readers)}: the exchange keeps "
                                   f"readers={','.join(ex.readers)}, those it was created with; write it with "
                                   "mode('overwrite') to change them", ErrorCode.LAYOUT_MISMATCH)
        else:
            if ex is None or ex.owner != owner:
                self.book.check_room(owner, name)
            ex = self._new_version(name, schema, num_subpartitions, partitioner, partition_type, coalesce, owner)
            ex.replicas = replicas
            ex.readers = checked_readers(readers) if readers else self.default_readers
        return await self._open_write(ex)

    async def declare_epoch(self, stream: str, name: str, schema: str, num_subpartitions: int | None,
                            partitioner: dict, partition_type: str, coalesce: bool, owner: str,
                            readers: tuple[str, ...] = (EVERYONE,)) -> dict:
        """A new version of a stream's epoch exchange ``name`` (counted with its stream, never on its own, read by
        the stream's readers)."""
        ex = self._new_version(name, schema, num_subpartitions, partitioner, partition_type, coalesce, owner, stream)
        ex.readers = readers
        return await self._open_write(ex)

    def _check_append(self, ex: Exchange, schema: str, partitioner: dict, partition_type: str,
                      num_subpartitions: int | None) -> None:
        name = ex.name
        if not same_schema(ex.schema, schema):
            raise ServiceError(
                f"append to exchange {name!r} with another schema: the exchange holds {schema_text(ex.schema)}, "
                f"this write has {schema_text(schema)}; use mode('overwrite') to replace it", ErrorCode.SCHEMA_MISMATCH)
        given = {"name": partitioner.get("name"), "keys": list(partitioner.get("keys") or []),
                 "custom": partitioner.get("custom"), "shared": bool(partitioner.get("shared"))}
        if not same_layout(ex, given, partition_type, num_subpartitions):
            raise ServiceError(
                f"append to exchange {name!r} with another layout: the exchange holds "
                f"{layout_text(ex.partitioner, ex.partition_type, ex.num_subpartitions)}, this write has "
                f"{layout_text(given, partition_type, num_subpartitions)}; an exchange keeps the layout it was "
                "created with: write it with mode('overwrite') (createOrReplace) to change it",
                ErrorCode.LAYOUT_MISMATCH)
        if num_subpartitions is not None and ex.coalesce and ex.num_subpartitions is None:
            ex.num_subpartitions = num_subpartitions  # an append that names the width fixes it

    def _new_version(self, name: str, schema: str, num_subpartitions: int | None, partitioner: dict,
                     partition_type: str, coalesce: bool, owner: str, stream: str = "") -> Exchange:
        book = self.book
        older = book.exchanges.get(name)
        if older is not None:
            self._set_aside(older)
        ex = Exchange(name, next(book.epochs), schema, num_subpartitions, partitioner, partition_type,
                      coalesce=bool(coalesce) and num_subpartitions is None, owner=owner, stream=stream)
        book.exchanges[name] = ex
        book.lost.pop(name, None)
        book.names_changed()
        return ex

    async def _open_write(self, ex: Exchange) -> dict:
        write_id = f"w{next(self.book.writes)}"
        await self._carry_out(ex, ex.life.on(Event.OPEN_WRITE, write_id))
        return {**ex.describe(), "write_id": write_id}

    def _set_aside(self, ex: Exchange) -> None:
        """An overwrite replaces ``ex``: its committed version is kept aside (its partitions held) until the
        new version commits, so an overwrite whose write fails leaves it readable; what is not committed
        (an open write's producers, an aborted version) goes now."""
        t = ex.life.on(Event.OVERWRITE, reason="overwritten")
        if t.state is ExchangeState.DROPPED:
            self.book.release_producers(list(ex.producers.values()), "overwritten", REPLACED)
            return
        committed = set(ex.committed)
        for action in t.actions:
            if action is Action.RELEASE_PREVIOUS:
                self.book.release_previous(ex.name, "overwritten")
            elif action is Action.RELEASE_UNCOMMITTED:
                uncommitted = [p for p in ex.producers.values() if p.partition not in committed]
                self.book.release_producers(uncommitted, "overwritten", REPLACED)
                for p in uncommitted:
                    ex.remove_producer(p.partition)
            elif action is Action.SEAL:
                ex.note_seal()
        self.book.previous[ex.name] = ex

    async def _carry_out(self, ex: Exchange, t: Transition, of_write: list[ProducerInfo] = (), why: str = "",
                         **notice: object) -> None:
        """Do what a transition says, in its order; ``of_write``: the producers of the write it released."""
        for action in t.actions:
            if action is Action.RELEASE_WRITE:
                for p in of_write:
                    ex.remove_producer(p.partition)
                self.book.release_producers(list(of_write), why)
            elif action is Action.RELEASE_PREVIOUS:
                self.book.release_previous(ex.name, "overwritten")
            elif action is Action.SEAL:
                ex.note_seal()
            elif action is Action.PERSIST:
                self.book.persist(ex)
            elif action is Action.NOTIFY:
                await self.book.subscriptions.notify(ex, ex.name, **notice)
            elif action is Action.RESTORE_PREVIOUS and ex.name in self.book.previous:
                await self._restore_previous(ex)

    async def _restore_previous(self, ex: Exchange) -> None:
        """A failed overwrite changes nothing: the version it was to replace is the exchange again. Writes still
        open on the failed version (an append to it) go with it: their producers are released now."""
        name = ex.name
        self.book.release_producers(list(ex.producers.values()), f"the overwrite of exchange {name!r} it wrote to "
                                    "failed; the exchange is its committed version again", REPLACED)
        restored = self.book.exchanges[name] = self.book.previous.pop(name)
        await self._carry_out(restored, restored.life.on(Event.RESTORE))

    async def register_producer(self, name: str, epoch: int, write_id: str, index: int, attempt: str,
                                partition: str, location: dict, num_subpartitions: int | None = None,
                                owner: str = "") -> dict:
        """A task attempt's partition joins the exchange. ``num_subpartitions``: the width this producer
        writes when the exchange's width was not given; the first one fixes it, another one is refused.

        ``owner``: the credential asking. A partition joins one exchange only, and only its own
        credential's: dropping an exchange releases its producers' partitions, so naming another's would
        destroy another's data. Two checks make that sound without a round trip to the holding service:
        a partition id already a producer of any exchange (or epoch) is refused here; and every release
        carries the credential that joined the partition, which the holding service compares with the
        credential that registered it there (``PartitionReleases.release_owned``): a partition registered
        by another is never freed for it. A partition this process holds is checked at once as well."""
        ex = self.book.get(name, epoch)
        location = self.locate(location)
        self._check_partition(ex, partition, location, owner)
        ex.life.check(Event.REGISTER, write_id)
        if ex.partitioner.get("name") == "forward" and ex.num_subpartitions is not None and index >= ex.num_subpartitions:
            raise ServiceError(
                f"forward needs equal parallelism: producer {index} has no subpartition among {ex.num_subpartitions}; "
                "repartition the DataFrame or set numSubpartitions to its partition count", ErrorCode.FORWARD_PARALLELISM)
        if num_subpartitions is not None:
            fix_width(ex, num_subpartitions)
        info = ProducerInfo(index, attempt, partition, location, write_id, owner=owner)
        if ex.replicas:  # the writer pushes every buffer to these too, under the same partition id
            info.replicas = [{"location": where, "state": ReplicaState.WRITING}
                             for where in self.pick_replicas(location, ex.replicas)]
        await self._carry_out(ex, ex.life.on(Event.REGISTER, write_id), changed=[ex.set_producer(info)])
        return {"ok": True, "num_subpartitions": ex.num_subpartitions,
                "replicas": [r["location"] for r in info.replicas]}

    def _check_partition(self, ex: Exchange, partition: str, location: dict, owner: str) -> None:
        """Refuse a partition held by another exchange, or registered by another credential (see above)."""
        from ..network.auth import OPERATOR

        for other in [*self.book.exchanges.values(), *self.book.previous.values()]:  # set-aside versions too
            if other is not ex and partition in other.producers:
                whose = other.owner
                code = ErrorCode.FORBIDDEN if owner and owner not in (OPERATOR, other.owner) else ErrorCode.BAD_REQUEST
                raise ServiceError(
                    f"partition {partition!r} is already a producer of exchange {other.name!r}"
                    f"{f' (credential {whose!r})' if whose else ''}: a partition joins one exchange only; a write "
                    "registers partitions of its own", code)
        registered_by = self.partition_owner(location, partition)
        if registered_by == "":
            raise ServiceError(f"partition {partition!r} is not held by the service its location names (never "
                               "registered there, or released already): a producer registers its partition with its "
                               "service first", ErrorCode.BAD_REQUEST)
        if owner and registered_by and owner not in (OPERATOR, registered_by):
            raise ServiceError(f"partition {partition!r} was registered by credential {registered_by!r}; this connection "
                               f"authenticated as {owner!r} cannot make it a producer of exchange {ex.name!r} (a write "
                               "registers partitions of its own)", ErrorCode.FORBIDDEN)

    async def producer_finished(self, name: str, epoch: int, partition: str, spill: str = "",
                                subpartition_bytes: list[int] | None = None, rows: int | None = None,
                                bytes: int | None = None, subpartition_rows: list[int] | None = None,
                                raw_bytes: int | None = None, replicas: list[str] | None = None,
                                subpartition_raw_bytes: list[int] | None = None) -> dict:
        """A producer finished; ``subpartition_bytes`` (bytes per subpartition) feed coalesced reads, ``rows``
        (what it pushed) is checked against its commit message; ``subpartition_rows`` (rows per subpartition)
        are summed at commit for readers that plan by rows; ``raw_bytes``: its bytes as they would be
        uncompressed, ``subpartition_raw_bytes`` per subpartition (a compressing Python writer's); ``replicas``: the services whose replica confirmed every buffer (the writer finished it)."""
        ex = self.book.get(name, epoch)
        p = ex.producers.get(partition)
        if p is not None:
            ex.life.check(Event.FINISH)
            record_sizes(ex, p, subpartition_bytes, rows, bytes, subpartition_rows, subpartition_raw_bytes)
            if raw_bytes is not None:
                p.raw_bytes = raw_bytes
            p.state = PartitionState.FINISHED
            p.spill = spill
            for r in p.replicas:
                if r["location"].get("service_id") in (replicas or ()) and r["state"] == ReplicaState.WRITING:
                    r["state"] = ReplicaState.COMPLETE
            await self._carry_out(ex, ex.life.on(Event.FINISH), changed=[ex.set_producer(p)])
        return {"ok": True}

    async def producer_failed(self, name: str, epoch: int | None, partition: str, reason: str) -> dict:
        """A producer's writer failed (its task says so). A committed producer is sealed: a failure reported after
        its commit changes nothing (its rows are finished and stay readable)."""
        ex = self.book.exchanges.get(name)
        if ex is not None and partition in ex.producers and (epoch is None or ex.epoch == epoch):
            await self._fail_producer(ex, ex.producers[partition], reason)
        return {"ok": True}

    async def holder_reports_failure(self, name: str, partition: str, reason: str, service_id: str,
                                     credential: str) -> None:
        """A service reports a partition it holds failing (the data plane's ``FailPartition``, or its writer's
        connection lost). Only the producer whose location is that service and that the same credential (or the
        operator) joined is failed: a partition of the same id on another service, registered by someone else,
        fails nothing."""
        ex = self.book.exchanges.get(name)
        if ex is None or partition not in ex.producers:
            return
        p = ex.producers[partition]
        if not _reported_by_holder(p, service_id, credential):
            log.warning("producer %s of exchange %r was not failed: the failure came from service %s for "
                        "credential %r, and the producer is held by service %s for credential %r", partition,
                        name, service_id, credential, p.location.get("service_id"), p.owner)
            return
        await self._fail_producer(ex, p, reason)

    async def _fail_producer(self, ex: Exchange, p: ProducerInfo, reason: str) -> None:
        if p.partition in ex.committed:
            log.info("producer %s of exchange %r is committed: a failure reported since (%s) changes nothing",
                     p.partition, ex.name, reason)
        elif p.state != PartitionState.FAILED:
            t = ex.life.on(Event.FAIL, reason=reason)
            p.state, p.reason = PartitionState.FAILED, reason
            await self._carry_out(ex, t, changed=[ex.set_producer(p)])

    async def commit(self, name: str, epoch: int, write_id: str, partitions: list[str],
                     rows: dict[str, int] | None = None) -> dict:
        """Seal the winning attempts of one write; every other attempt of it is released.

        ``rows``: per partition, the rows its task's commit message says it wrote; refused ("lost") when a
        producer reported pushing other than that."""
        ex = self.book.get(name, epoch)
        ex.life.check(Event.COMMIT, write_id)
        missing = [p for p in partitions if p not in ex.producers]
        if missing:
            raise ServiceError(f"commit names partitions that never registered: {missing}", ErrorCode.BAD_REQUEST)
        check_rows(ex, partitions, rows)
        if ex.replicas:
            self._check_replicated(ex, partitions)
        winners = set(partitions)
        of_write = [p for p in ex.producers.values() if p.write_id == write_id]
        check_tasks_covered(ex, of_write, winners)
        indexes = sorted(ex.producers[p].index for p in partitions)
        if len(set(indexes)) != len(indexes):
            raise ServiceError(f"commit of {name!r} names two attempts of one task: {indexes}", ErrorCode.BAD_REQUEST)
        if ex.partitioner.get("name") == "forward":
            total = len(ex.committed) + len(partitions)
            if ex.num_subpartitions is not None and total != ex.num_subpartitions:
                raise ServiceError(
                    f"forward needs equal parallelism: {total} producers but numSubpartitions={ex.num_subpartitions}; "
                    "repartition the DataFrame or drop the numSubpartitions option", ErrorCode.FORWARD_PARALLELISM)
        if ex.num_subpartitions is None:
            ex.num_subpartitions = len(ex.committed) + len(partitions)
        losers = [p for p in of_write if p.partition not in winners]
        add_sizes(ex, partitions)  # before the commit counts: it tells a first commit from a later one
        ex.committed.extend(partitions)
        t = ex.life.on(Event.COMMIT, write_id)
        await self._carry_out(ex, t, losers, "another attempt of its task won the commit",
                              committed=list(ex.committed), removed=[p.partition for p in losers])
        return ex.describe()

    @staticmethod
    def _check_replicated(ex: Exchange, partitions: list[str]) -> None:
        """A replicated write commits only when every replica of every partition holds all of it."""
        for pid in partitions:
            p = ex.producers[pid]
            complete = [r for r in p.replicas if r["state"] == ReplicaState.COMPLETE]
            if len(complete) < ex.replicas:
                states = ", ".join(f"{r['location'].get('service_id')} on host {r['location'].get('host_id')}: "
                                   f"{r['state']}" for r in p.replicas) or "none placed"
                raise ServiceError(
                    f"commit of exchange {ex.name!r} is refused: partition {pid} (producer {p.index}) has "
                    f"{len(complete)} of replicas={ex.replicas} complete copies ({states}); a replicated write "
                    "commits only when every copy holds the whole partition: write it again",
                    ErrorCode.REPLICA_LOST)

    async def abort(self, name: str, epoch: int, write_id: str, reason: str = "") -> dict:
        """Release a failed write's producers. Commit wins: an abort of a write that is no longer open
        (committed, or aborted already) changes nothing (Spark may abort a job after our commit went through)."""
        ex = self.book.exchanges.get(name)
        if ex is None or ex.epoch != epoch:
            return {"ok": True}
        t = ex.life.on(Event.ABORT, write_id, reason)
        if t.ignored:
            why = f"{t.ignored}{': ' + reason if reason else ''}"
            log.warning("%s", why)
            return {"ok": True, "ignored": why}
        of_write = [p for p in ex.producers.values() if p.write_id == write_id]
        await self._carry_out(ex, t, of_write, f"its write was aborted ({reason or 'the write failed'})",
                              removed=[p.partition for p in of_write])
        return {"ok": True}

    async def drop(self, name: str) -> dict:
        return await self.book.end(name, Event.RELEASE, "dropped")

    async def discard(self, name: str, reason: str) -> dict:
        """Drop ``name`` for ``reason`` (a stream releases its epochs so)."""
        return await self.book.end(name, Event.RELEASE, reason)


def _reported_by_holder(p: ProducerInfo, service_id: str, credential: str) -> bool:
    """Whether a failure a service reported of a partition it holds is this producer's: same service, and the
    credential that registered it there is the one that joined the producer (or the operator)."""
    return p.location.get("service_id") == service_id and (credential == OPERATOR or not p.owner
                                                            or credential == p.owner)
