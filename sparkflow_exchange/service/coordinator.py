"""The coordinator role: exchanges, their producers and their lifecycle.

Flink's JobManager partition tracking, reduced to what a Spark write needs:
the driver declares an exchange with its schema; every task attempt registers
its result partition and location; commit seals the winning attempts; abort
and drop release everything. Readers subscribe and are told the producer set
each time it changes, until it is sealed. All of it runs on the service's
event loop, so no locks.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ErrorCode, ServiceError
from ..kinds import ExchangeState, PartitionState, ServiceState
from .clock import wall_time
from .journal import Journal
from .registry import ServiceRecord, ServiceRegistry

if TYPE_CHECKING:
    import numpy as np  # imported where sizes arrive: the service is ready about 45 ms sooner without it

log = logging.getLogger(__name__)

FORWARD_LIKE = ("forward", "broadcast")  # one subpartition per producer; N may be fixed at commit


@dataclass
class ProducerInfo:
    index: int
    attempt: str
    partition: str
    location: dict
    write_id: str
    state: PartitionState = PartitionState.RUNNING
    reason: str = ""
    spill: str = ""  # data file of a finished re-readable partition (local readers may read it directly)
    rows: int = -1  # rows it pushed, reported at finish (-1: not reported); checked against its commit message
    bytes: int = -1  # bytes it wrote, reported at finish (-1: not reported); a stream's retention counts them
    raw_bytes: int = -1  # those bytes as they would be uncompressed (-1: not reported)
    owner: str = ""  # the credential that joined it to the exchange: releasing it frees only a partition it registered

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Exchange:
    name: str
    epoch: int
    schema: str  # base64 Arrow IPC schema
    num_subpartitions: int | None
    partitioner: dict
    partition_type: str
    state: ExchangeState = ExchangeState.OPEN
    producers: dict[str, ProducerInfo] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)
    open_writes: set[str] = field(default_factory=set)
    commits: int = 0
    last_used: float = field(default_factory=time.monotonic)
    created: float = field(default_factory=time.time)  # wall clock: when this version of the exchange was declared
    abort_reason: str = ""
    coalesce: bool = False  # the width was not given: fixed by the first producer, reads may coalesce
    # per producer: bytes it wrote to each subpartition (reported at finish); summed over the committed at commit
    sizes: dict[str, np.ndarray] = field(default_factory=dict)
    committed_bytes: np.ndarray | None = None
    # per producer: rows it wrote to each subpartition (reported at finish); summed like the sizes. Clients
    # outside Spark (a training loop's ranks) plan equal shares from them before reading a row
    row_counts: dict[str, np.ndarray] = field(default_factory=dict)
    committed_sub_rows: np.ndarray | None = None
    sizes_complete: bool = True  # every committed producer reported its sizes
    committed_rows: int | None = 0  # rows of the committed producers (None once one did not report its rows)
    stream: str = ""  # the stream this exchange is an epoch of (service/streams.py), "" for a batch exchange
    owner: str = ""  # the credential that declared it (service/owners.py); a stream's epoch: the stream's
    # len(committed) at each seal (no write open any more, after a commit or an abort): the states a read
    # planned while writes were open may see; such a read reads the first seal after its planning
    seal_ends: list[int] = field(default_factory=list)
    _producer_dicts: dict[str, dict] = field(default_factory=dict)  # describe() cache, kept per producer

    def set_producer(self, p: ProducerInfo) -> dict:
        """Store (or update) a producer; returns its description, cached for describe()."""
        self.producers[p.partition] = p
        d = self._producer_dicts[p.partition] = p.to_dict()
        return d

    def remove_producer(self, partition: str) -> None:
        self.producers.pop(partition, None)
        self._producer_dicts.pop(partition, None)
        self.sizes.pop(partition, None)
        self.row_counts.pop(partition, None)

    @property
    def sealed(self) -> bool:
        return self.commits > 0 and not self.open_writes

    def note_seal(self) -> None:
        """Record a seal (call after a commit or abort closed a write): a state reads may end at."""
        if self.sealed:
            self.seal_ends.append(len(self.committed))

    def read_state(self, seal: int) -> list[str] | None:
        """The committed producers a read planned after ``seal`` seals reads, once that state exists."""
        if 0 <= seal < len(self.seal_ends):
            return self.committed[:self.seal_ends[seal]]
        return None

    def record(self) -> dict[str, Any]:
        """Everything a restarted coordinator needs to serve it again (service/journal.py)."""
        def listed(a: np.ndarray | None) -> list[int] | None:
            return None if a is None else a.tolist()

        return {
            "name": self.name, "epoch": self.epoch, "schema": self.schema, "num_subpartitions": self.num_subpartitions,
            "partitioner": self.partitioner, "partition_type": self.partition_type, "state": self.state,
            "producers": [p.to_dict() for p in self.producers.values()], "committed": list(self.committed),
            "open_writes": sorted(self.open_writes), "commits": self.commits, "abort_reason": self.abort_reason,
            "coalesce": self.coalesce, "sizes": {k: v.tolist() for k, v in self.sizes.items()},
            "row_counts": {k: v.tolist() for k, v in self.row_counts.items()},
            "committed_bytes": listed(self.committed_bytes), "committed_sub_rows": listed(self.committed_sub_rows),
            "sizes_complete": self.sizes_complete, "committed_rows": self.committed_rows, "owner": self.owner,
            "seal_ends": list(self.seal_ends), "created": self.created,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> "Exchange":
        import numpy as np

        def array(v: list[int] | None) -> np.ndarray | None:
            return None if v is None else np.asarray(v, dtype=np.int64)

        ex = cls(r["name"], int(r["epoch"]), r["schema"], r["num_subpartitions"], r["partitioner"],
                 r["partition_type"], ExchangeState(r["state"]), commits=int(r["commits"]),
                 committed=list(r["committed"]), open_writes=set(r["open_writes"]), abort_reason=r["abort_reason"],
                 coalesce=bool(r["coalesce"]), sizes={k: array(v) for k, v in r["sizes"].items()},
                 row_counts={k: array(v) for k, v in r["row_counts"].items()},
                 committed_bytes=array(r["committed_bytes"]), committed_sub_rows=array(r["committed_sub_rows"]),
                 sizes_complete=bool(r["sizes_complete"]), committed_rows=r["committed_rows"], owner=r["owner"],
                 seal_ends=list(r["seal_ends"]))
        ex.created = float(r.get("created", ex.created))  # a record without it: the restart's time
        for p in r["producers"]:
            ex.set_producer(ProducerInfo(**{**p, "state": PartitionState(p["state"])}))
        return ex

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "epoch": self.epoch,
            "schema": self.schema,
            "num_subpartitions": self.num_subpartitions,
            "partitioner": self.partitioner,
            "partition_type": self.partition_type,
            "state": self.state,
            "sealed": self.sealed,
            "seals": len(self.seal_ends),
            "seal_ends": list(self.seal_ends),  # len(committed) at each seal: what a read planned before it reads
            "open_writes": len(self.open_writes),
            "abort_reason": self.abort_reason,
            "coalesce": self.coalesce,
            "producers": list(self._producer_dicts.values()),
            "committed": list(self.committed),
            "subpartition_bytes": self.subpartition_bytes(),
            "rows": self.committed_rows,
            "subpartition_rows": self.subpartition_rows(),
            "owner": self.owner,
            "created_at": self.created,
            "last_used_at": wall_time(self.last_used),
        }

    def header(self) -> dict[str, Any]:
        """What every notification carries besides its change: state, epoch, width, seal."""
        return {"name": self.name, "epoch": self.epoch, "state": self.state, "sealed": self.sealed,
                "seals": len(self.seal_ends), "num_subpartitions": self.num_subpartitions,
                "abort_reason": self.abort_reason}

    def subpartition_bytes(self) -> list[int] | None:
        """Bytes per subpartition over the committed producers, when all of them reported theirs."""
        if self.committed_bytes is None or not self.sizes_complete:
            return None
        return self.committed_bytes.tolist()

    def subpartition_rows(self) -> list[int] | None:
        """Rows per subpartition over the committed producers, when all of them reported theirs."""
        if self.committed_sub_rows is None or not self.sizes_complete:
            return None
        return self.committed_sub_rows.tolist()


# (location, partition id, the credential that joined it)s, why, and the code its writer is told ("replaced": a
# drop, overwrite or expiry)
Release = Callable[[list[tuple[dict, str, str]], str, str], None]
# (location, partition id) -> the credential that registered the partition, when the location is this process's
# service ("" when it holds no such partition); None for a location elsewhere
PartitionOwner = Callable[[dict, str], "str | None"]
REPLACED = ErrorCode.REPLACED  # the exchange went (dropped, overwritten, expired): its writers fail with ExchangeReplaced
RELEASED = ErrorCode.RELEASED  # one write or attempt went (lost the commit, aborted); the exchange stays


class Coordinator:
    def __init__(self, release: Release, ttl: float = 3600.0, heartbeat_timeout: float = 10.0,
                 partition_owner: PartitionOwner = lambda location, pid: None, max_exchanges_per_owner: int = 0,
                 lost_retention: float = 600.0) -> None:
        """``max_exchanges_per_owner``: exchanges and streams one application credential may own at once
        (maxExchangesPerCredential; 0: no cap; the operator has none)."""
        self.exchanges: dict[str, Exchange] = {}
        # name -> the committed version an open overwrite replaces: released when the overwrite commits,
        # the name's version again when it aborts (a failed write changes nothing)
        self.previous: dict[str, Exchange] = {}
        self.partition_owner = partition_owner
        self.max_exchanges_per_owner = max_exchanges_per_owner
        self.streams_of: Callable[[str], int] = lambda owner: 0  # streams a credential owns (the stream registry)
        self.services = ServiceRegistry(heartbeat_timeout)  # the services that hold partitions for us
        self.journal: Journal | None = None  # the state directory, when it has one (restore())
        self.release = release  # called with (location, partition id) of partitions to free, and why
        self.ttl = ttl
        self.lost_retention = lost_retention  # s a lost service stays listed (lostServiceRetention)
        self._epochs = itertools.count(1)
        self._writes = itertools.count(1)
        self._changed = asyncio.Condition()
        self._subscribers: dict[str, set[Callable[[dict], None]]] = {}
        # name -> {"message", "at"}: exchanges whose data went with a service that died (ledger.py)
        self.lost: dict[str, dict] = {}
        self.on_names_changed: Callable[[list[str], dict[str, dict]], None] | None = None
        self.is_stream: Callable[[str], bool] = lambda name: False  # set by the stream registry

    def _names_changed(self) -> None:
        if self.journal is not None:
            self.journal.save_lost(self.lost)
        if self.on_names_changed is not None:
            self.on_names_changed(sorted(self.exchanges), dict(self.lost))

    # ------------------------------------------------------------ helpers
    def _persist(self, ex: Exchange) -> None:
        """Write the exchange to the state directory (a state reads may see: declared, sealed, aborted)."""
        if self.journal is not None and not ex.stream and self.exchanges.get(ex.name) is ex:
            record = ex.record()
            older = self.previous.get(ex.name)
            if older is not None:  # an open overwrite: a restart that aborts it gives the name this version again
                record["previous"] = older.record()
            self.journal.save_exchange(ex.name, record)

    def _get(self, name: str, epoch: int | None = None) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None and epoch is not None:  # a write or read of it is running: it was there
            raise ServiceError(f"exchange {name!r} was dropped (or expired) while this write or read was running",
                           ErrorCode.REPLACED)
        if ex is None:
            raise ServiceError(f"exchange {name!r} does not exist", ErrorCode.NO_EXCHANGE)
        if epoch is not None and ex.epoch != epoch:
            raise ServiceError(
                f"exchange {name!r} was replaced (overwrite or drop) while this write or read was running", ErrorCode.REPLACED
            )
        ex.last_used = time.monotonic()
        return ex

    async def _notify(self, ex: Exchange | None, name: str, changed: list[dict] = (), **extra: Any) -> None:
        """Tell subscribers what changed (a delta after the full state they got at subscribe)."""
        subscribers = self._subscribers.get(name)
        if subscribers:
            body = {**ex.header(), "producers": list(changed), **extra} if ex is not None \
                else {"name": name, "state": ExchangeState.DROPPED, **extra}
            for callback in list(subscribers):
                callback(body)
        async with self._changed:
            self._changed.notify_all()

    def _release_producers(self, producers: list[ProducerInfo], reason: str, code: ErrorCode = RELEASED) -> None:
        """Free the producers' partitions; their connected readers and running writers get ``reason`` at once."""
        if producers:
            self.release([(p.location, p.partition, p.owner) for p in producers], reason, code)

    def check_room(self, owner: str, name: str, what: str = "exchange") -> None:
        """Refuse a new exchange or stream of ``owner`` that owns as many as one credential may."""
        from ..network.auth import OPERATOR

        if not owner or owner == OPERATOR or not self.max_exchanges_per_owner:
            return
        owned = sum(1 for ex in self.exchanges.values() if ex.owner == owner and not ex.stream) + self.streams_of(owner)
        if owned >= self.max_exchanges_per_owner:
            raise ServiceError(f"declaring {what} {name!r} is refused: credential {owner!r} owns {owned} exchanges and "
                               f"streams, and one application credential may own at most maxExchangesPerCredential="
                               f"{self.max_exchanges_per_owner}; drop one it no longer needs", ErrorCode.LIMIT)

    def _set_aside(self, ex: Exchange) -> None:
        """An overwrite replaces ``ex``: its committed version is kept aside (its partitions held) until the
        new version commits, so an overwrite whose write fails leaves it readable; what is not committed
        (an open write's producers, an aborted version) goes now."""
        if ex.stream or ex.commits == 0 or ex.state == ExchangeState.ABORTED:
            self._release_producers(list(ex.producers.values()), "overwritten", REPLACED)
            return
        older = self.previous.pop(ex.name, None)
        if older is not None:
            self._release_producers(list(older.producers.values()), "overwritten", REPLACED)
        committed = set(ex.committed)
        self._release_producers([p for p in ex.producers.values() if p.partition not in committed], "overwritten",
                                REPLACED)
        for partition in [p for p in ex.producers if p not in committed]:
            ex.remove_producer(partition)
        if ex.open_writes:  # an append was open: the version kept is its last commit
            ex.open_writes.clear()
            ex.note_seal()
        ex.state = ExchangeState.COMMITTED
        self.previous[ex.name] = ex

    def _release_previous(self, name: str, reason: str) -> None:
        """The version an overwrite set aside goes: the overwrite committed, or the name was dropped or lost."""
        older = self.previous.pop(name, None)
        if older is not None:
            self._release_producers(list(older.producers.values()), reason, REPLACED)

    # ------------------------------------------------------------ writer side
    async def declare(self, name: str, schema: str, num_subpartitions: int | None, partitioner: dict,
                      partition_type: str, mode: str, coalesce: bool = False, owner: str = "") -> dict:
        """Start a write: create (overwrite) or extend (append) an exchange; returns its description + write id.

        ``coalesce``: the width was not given (hash, rebalance, rescale, custom): the first producer fixes it
        when it registers, and reads of the sealed exchange may group adjacent subpartitions."""
        if not name:
            raise ServiceError("the 'exchange' option is required (the name of the exchange)", ErrorCode.BAD_REQUEST)
        if mode not in ("overwrite", "append"):
            raise ServiceError(f"unknown save mode {mode!r}", ErrorCode.BAD_REQUEST)
        if self.is_stream(name):
            raise ServiceError(f"exchange {name!r} is a stream written by a streaming query; a batch write cannot "
                           "write it: use another name, or drop the stream first", ErrorCode.BAD_REQUEST)
        ex = self.exchanges.get(name)
        if ex is not None and mode == "append" and ex.state != ExchangeState.ABORTED:
            if not same_schema(ex.schema, schema):
                raise ServiceError(
                    f"append to exchange {name!r} with another schema: the exchange holds {_schema_text(ex.schema)}, "
                    f"this write has {_schema_text(schema)}; use mode('overwrite') to replace it",
                    ErrorCode.SCHEMA_MISMATCH,
                )
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
        else:
            if ex is None or ex.owner != owner:
                self.check_room(owner, name)
            if ex is not None:
                self._set_aside(ex)
            ex = Exchange(name, next(self._epochs), schema, num_subpartitions, partitioner, partition_type,
                          coalesce=bool(coalesce) and num_subpartitions is None, owner=owner)
            self.exchanges[name] = ex
            self.lost.pop(name, None)
            self._names_changed()
        write_id = f"w{next(self._writes)}"
        ex.open_writes.add(write_id)
        ex.state = ExchangeState.OPEN
        self._persist(ex)
        await self._notify(ex, name)
        return {**ex.describe(), "write_id": write_id}

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
        credential that registered it there (``ExchangeService.release_owned``): a partition registered
        by another is never freed for it. A partition this process holds is checked at once as well."""
        ex = self._get(name, epoch)
        location = self.registered_location(location)
        self._check_partition(ex, partition, location, owner)
        if write_id not in ex.open_writes:
            raise ServiceError(f"write {write_id} of exchange {name!r} is not open (committed or aborted already)", ErrorCode.WRITE_CLOSED)
        if ex.partitioner.get("name") == "forward" and ex.num_subpartitions is not None and index >= ex.num_subpartitions:
            raise ServiceError(
                f"forward needs equal parallelism: producer {index} has no subpartition among {ex.num_subpartitions}; "
                "repartition the DataFrame or set numSubpartitions to its partition count", ErrorCode.FORWARD_PARALLELISM)
        if num_subpartitions is not None:
            self._fix_width(ex, num_subpartitions)
        info = ProducerInfo(index, attempt, partition, location, write_id, owner=owner)
        await self._notify(ex, name, [ex.set_producer(info)])
        return {"ok": True, "num_subpartitions": ex.num_subpartitions}

    def registered_location(self, location: dict) -> dict:
        """A producer's location as the registry holds it: readers dial, and releases go to, only addresses a
        registered service (one that proved the operator's secret) gave, never ones a writer chose. Refused
        (``unregistered_service``) when it names no live registered service, or puts it at another address."""
        sid = location.get("service_id")
        record = self.services.services.get(sid) if isinstance(sid, str) else None
        if record is None:
            raise ServiceError(
                f"the producer's location names {sid!r}, which is not a registered exchange service of this "
                "coordinator: a partition must live in the coordinator's own service or in one that registered "
                "with it (`sparkflow-exchange serve --no-coordinator` with coordinator set, the Spark plugin's)",
                ErrorCode.UNREGISTERED_SERVICE)
        if record.state != ServiceState.ALIVE:
            raise ServiceError(f"the producer's location names {record.where()}, which was declared lost "
                               f"({record.lost_reason}); write the partition again", ErrorCode.UNREGISTERED_SERVICE)
        for key in ("tcp", "unix"):
            given = location.get(key)
            if given and given != getattr(record, key):
                raise ServiceError(
                    f"the producer's location puts exchange service {sid!r} at {key} address {given!r}, but it "
                    f"registered {getattr(record, key)!r}: a location is the service's own answer to ping",
                    ErrorCode.UNREGISTERED_SERVICE)
        return {**location, **record.location()}

    def _check_partition(self, ex: Exchange, partition: str, location: dict, owner: str) -> None:
        """Refuse a partition held by another exchange, or registered by another credential (see above)."""
        from ..network.auth import OPERATOR

        for other in [*self.exchanges.values(), *self.previous.values()]:  # versions an open overwrite set aside too
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

    @staticmethod
    def _fix_width(ex: Exchange, width: int) -> None:
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ServiceError(f"numSubpartitions must be a positive integer, got {width!r}", ErrorCode.BAD_REQUEST)
        if ex.num_subpartitions is None:
            if not ex.coalesce:
                raise ServiceError(f"exchange {ex.name!r} has no width to fix: it was declared with numSubpartitions "
                               "or as forward/broadcast", ErrorCode.BAD_REQUEST)
            ex.num_subpartitions = width
        elif ex.num_subpartitions != width:
            raise ServiceError(
                f"exchange {ex.name!r} has {ex.num_subpartitions} subpartitions (fixed by its first producer, from "
                f"spark.sql.shuffle.partitions of the writing session), but this producer writes {width}: every "
                "write of one exchange needs the same spark.sql.shuffle.partitions, or set numSubpartitions",
                ErrorCode.WIDTH_MISMATCH)

    async def producer_finished(self, name: str, epoch: int, partition: str, spill: str = "",
                                subpartition_bytes: list[int] | None = None, rows: int | None = None,
                                bytes: int | None = None, subpartition_rows: list[int] | None = None,
                                raw_bytes: int | None = None) -> dict:
        """A producer finished; ``subpartition_bytes`` (bytes per subpartition) feed coalesced reads, ``rows``
        (what it pushed) is checked against its commit message; ``subpartition_rows`` (rows per subpartition)
        are summed at commit for readers that plan by rows."""
        import numpy as np

        ex = self._get(name, epoch)
        p = ex.producers.get(partition)
        if p is not None:
            if rows is not None:
                p.rows = rows
            if bytes is not None:
                p.bytes = bytes
            if raw_bytes is not None:
                p.raw_bytes = raw_bytes
            if subpartition_bytes is not None:
                sizes = np.asarray(subpartition_bytes, dtype=np.int64)
                if sizes.ndim != 1 or (sizes.size and sizes.min() < 0):
                    raise ServiceError(f"producer {partition} reported malformed subpartition sizes", ErrorCode.BAD_REQUEST)
                # a forward/broadcast producer has one subpartition of its own: its sizes do not add up per
                # subpartition, so it reports none (the commit then knows the sizes are incomplete)
                if ex.num_subpartitions is not None and len(sizes) == ex.num_subpartitions:
                    # held until commit (2,000 x 2,000 would be 32 MB as int64): the narrowest type that fits
                    ex.sizes[partition] = sizes.astype(np.uint32) if not sizes.size or sizes.max() < 1 << 32 else sizes
            if subpartition_rows is not None and ex.num_subpartitions is not None \
                    and len(subpartition_rows) == ex.num_subpartitions:
                counts = np.asarray(subpartition_rows, dtype=np.int64)
                if counts.ndim != 1 or (counts.size and counts.min() < 0):
                    raise ServiceError(f"producer {partition} reported malformed subpartition rows", ErrorCode.BAD_REQUEST)
                ex.row_counts[partition] = counts.astype(np.uint32) if not counts.size or counts.max() < 1 << 32 else counts
            p.state = PartitionState.FINISHED
            p.spill = spill
            await self._notify(ex, name, [ex.set_producer(p)])
        return {"ok": True}

    async def producer_failed(self, name: str, epoch: int | None, partition: str, reason: str) -> dict:
        ex = self.exchanges.get(name)
        if ex is not None and partition in ex.producers and (epoch is None or ex.epoch == epoch):
            p = ex.producers[partition]
            if p.state != PartitionState.FAILED:
                p.state, p.reason = PartitionState.FAILED, reason
                await self._notify(ex, name, [ex.set_producer(p)])
        return {"ok": True}

    async def commit(self, name: str, epoch: int, write_id: str, partitions: list[str],
                     rows: dict[str, int] | None = None) -> dict:
        """Seal the winning attempts of one write; every other attempt of it is released.

        ``rows``: per partition, the rows its task's commit message says it wrote; refused ("lost") when a
        producer reported pushing other than that."""
        ex = self._get(name, epoch)
        if write_id not in ex.open_writes:
            raise ServiceError(f"write {write_id} of exchange {name!r} is not open", ErrorCode.WRITE_CLOSED)
        missing = [p for p in partitions if p not in ex.producers]
        if missing:
            raise ServiceError(f"commit names partitions that never registered: {missing}", ErrorCode.BAD_REQUEST)
        self._check_rows(ex, partitions, rows)
        winners = set(partitions)
        of_write = [p for p in ex.producers.values() if p.write_id == write_id]
        self._check_tasks_covered(ex, of_write, winners)
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
        for p in losers:
            ex.remove_producer(p.partition)
        self._release_producers(losers, "another attempt of its task won the commit")
        self._add_sizes(ex, partitions)
        ex.committed.extend(partitions)
        ex.open_writes.discard(write_id)
        ex.commits += 1
        self._release_previous(name, "overwritten")
        ex.state = ExchangeState.COMMITTED if not ex.open_writes else ExchangeState.OPEN
        ex.note_seal()
        self._persist(ex)
        await self._notify(ex, name, committed=list(ex.committed), removed=[p.partition for p in losers])
        return ex.describe()

    @staticmethod
    def _check_rows(ex: Exchange, partitions: list[str], rows: dict[str, int] | None) -> None:
        """Every committed producer pushed the rows its task says it wrote (when both are known)."""
        rows = rows or {}
        wrong = [(p, rows[p], ex.producers[p].rows) for p in partitions
                 if isinstance(rows.get(p), int) and ex.producers[p].rows >= 0 and rows[p] != ex.producers[p].rows]
        if wrong:
            listed = ", ".join(f"producer {ex.producers[p].index} (partition {p}): task wrote {w} rows, pushed {g}"
                               for p, w, g in wrong[:5])
            raise ServiceError(f"commit of exchange {ex.name!r} refused: rows lost ({listed})", ErrorCode.ROWS_LOST)
        reported = [ex.producers[p].rows for p in partitions]
        if ex.committed_rows is not None:
            ex.committed_rows = None if any(r < 0 for r in reported) else ex.committed_rows + sum(reported)

    @staticmethod
    def _check_tasks_covered(ex: Exchange, of_write: list[ProducerInfo], winners: set[str]) -> None:
        """A commit holds every task that wrote rows: a task whose finished producers pushed rows but none of whose
        attempts the commit names means the driver lost its commit message (never an empty commit of a full write)."""
        covered = {p.index for p in of_write if p.partition in winners}
        uncovered: dict[int, int] = {}
        for p in of_write:
            if p.index not in covered and p.state == PartitionState.FINISHED and p.rows > 0:
                uncovered[p.index] = max(uncovered.get(p.index, 0), p.rows)
        if uncovered:
            listed = ", ".join(f"task {i} ({n} rows)" for i, n in sorted(uncovered.items())[:5])
            raise ServiceError(
                f"commit of exchange {ex.name!r} refused: it names {len(winners)} partitions, but {len(uncovered)} "
                f"tasks of this write pushed rows and none of their attempts is committed ({listed}); the writing "
                "driver lost their commit messages", ErrorCode.ROWS_LOST)

    @staticmethod
    def _add_sizes(ex: Exchange, partitions: list[str]) -> None:
        """Sum the winners' per-subpartition bytes into the exchange's one array (readers get only that)."""
        import numpy as np

        if ex.num_subpartitions is None or not partitions:
            return
        total = ex.committed_bytes if ex.committed_bytes is not None else np.zeros(ex.num_subpartitions, np.int64)
        reported = [ex.sizes.pop(p) for p in partitions if p in ex.sizes]
        counted = [ex.row_counts.pop(p) for p in partitions if p in ex.row_counts]
        if len(reported) < len(partitions) or any(len(r) != ex.num_subpartitions for r in reported):
            ex.sizes_complete = False  # e.g. forward: one subpartition per producer
            return
        total = total.copy()
        for sizes in reported:  # one at a time: stacking them would copy every producer's array
            total += sizes
        ex.committed_bytes = total
        if len(counted) < len(partitions) or (ex.commits and ex.committed_sub_rows is None):
            ex.committed_sub_rows = None  # a producer that did not count its rows (an older client)
            return
        rows = ex.committed_sub_rows.copy() if ex.committed_sub_rows is not None else np.zeros(ex.num_subpartitions, np.int64)
        for counts in counted:
            rows += counts
        ex.committed_sub_rows = rows

    async def abort(self, name: str, epoch: int, write_id: str, reason: str = "") -> dict:
        """Release a failed write's producers. Commit wins: an abort of a write that is no longer open
        (committed, or aborted already) changes nothing (Spark may abort a job after our commit went through)."""
        ex = self.exchanges.get(name)
        if ex is None or ex.epoch != epoch:
            return {"ok": True}
        if write_id not in ex.open_writes:
            why = (f"abort of write {write_id} of exchange {name!r} ignored: it is not open (committed or aborted "
                   f"already; commit wins){': ' + reason if reason else ''}")
            log.warning("%s", why)
            return {"ok": True, "ignored": why}
        ex.open_writes.discard(write_id)
        of_write = [p for p in ex.producers.values() if p.write_id == write_id]
        for p in of_write:
            ex.remove_producer(p.partition)
        self._release_producers(of_write, f"its write was aborted ({reason or 'the write failed'})")
        if ex.commits == 0:
            ex.state = ExchangeState.ABORTED
            ex.abort_reason = reason or "the write failed"
        elif not ex.open_writes:
            ex.state = ExchangeState.COMMITTED  # an aborted append leaves what was committed before
            ex.note_seal()
        self._persist(ex)
        await self._notify(ex, name, removed=[p.partition for p in of_write])
        if ex.state == ExchangeState.ABORTED and name in self.previous:
            # a failed overwrite changes nothing: the version it was to replace is the exchange again. Writes
            # still open on the failed version (an append to it) go with it: their producers are released now
            self._release_producers(list(ex.producers.values()), f"the overwrite of exchange {name!r} it "
                                    "wrote to failed; the exchange is its committed version again", REPLACED)
            restored = self.exchanges[name] = self.previous.pop(name)
            self._persist(restored)
            await self._notify(restored, name)
        return {"ok": True}

    async def drop(self, name: str) -> dict:
        return await self._drop(name, "dropped")

    async def _drop(self, name: str, reason: str) -> dict:
        ex = self.exchanges.pop(name, None)
        if ex is None:
            if self.lost.pop(name, None) is not None:
                self._names_changed()
                return {"dropped": name, "partitions": 0}
            raise ServiceError(f"exchange {name!r} does not exist", ErrorCode.NO_EXCHANGE)
        if self.journal is not None:
            self.journal.remove_exchange(name)
        self._names_changed()
        self._release_producers(list(ex.producers.values()), reason, REPLACED)
        self._release_previous(name, reason)
        await self._notify(None, name)
        return {"dropped": name, "partitions": len(ex.producers)}

    # ------------------------------------------------------------ services (registry.py)
    async def register_service(self, service_id: str, host_id: str, tcp: str, unix: str, pid: int) -> dict:
        """A service that holds partitions for this coordinator says it is there (at start, and again
        whenever it lost us: a coordinator restart, a broken connection, being declared lost)."""
        known = service_id in self.services.services
        replaced = self.services.register(service_id, host_id, tcp, unix, pid)
        if not known or replaced:
            log.info("exchange service %s on host %s (%s) registered", service_id, host_id, tcp)
        self._save_services()
        if replaced:
            await self.services_lost(replaced)
        # what it holds for us: it frees the finished partitions of exchanges dropped, lost or aborted
        # while it could not be told (a restart, a failed release)
        held = [p.partition for ex in [*self.exchanges.values(), *self.previous.values()]
                for p in ex.producers.values() if p.location.get("service_id") == service_id]
        return {"ok": True, "heartbeat_timeout": self.services.timeout, "partitions": held}

    async def service_heartbeat(self, service_id: str) -> dict:
        """``known`` false: the service must register (again)."""
        return {"known": self.services.heartbeat(service_id)}

    async def list_services(self) -> list[dict]:
        return self.services.describe()

    async def check_services(self) -> None:
        """Declare lost the services whose heartbeats stopped, and their exchanges with them."""
        lost = self.services.expire()
        if lost:
            self._save_services()
            await self.services_lost(lost)
        self._forget_lost()

    def _forget_lost(self) -> None:
        """Lost services are listed for lostServiceRetention, then forgotten: one line each."""
        forgotten = self.services.forget_lost(self.lost_retention)
        for record in forgotten:
            log.info("forgot %s, lost %.0f s ago (lostServiceRetention=%g s)", record.where(),
                     time.time() - record.lost_at, self.lost_retention)
        if forgotten:
            self._save_services()

    def _save_services(self) -> None:
        if self.journal is not None:
            self.journal.save_services(self.services.snapshot())

    async def services_lost(self, records: list[ServiceRecord], *, announce: bool = True) -> None:
        """An exchange with a committed partition on a lost service is lost (its data is incomplete for good);
        a running producer there failed (its task is retried elsewhere, or its write aborts). ``announce``:
        log each loss (once, when it happens; not again when a restarted coordinator takes them up)."""
        by_id = {r.service_id: r for r in records}
        for record in records if announce else ():
            log.warning("%s is lost: %s", record.where(), record.lost_reason)
        for name, older in list(self.previous.items()):  # a version set aside with data there cannot come back
            if any(p.location.get("service_id") in by_id for p in older.producers.values()):
                self._release_previous(name, f"lost with a service that held it ({older.name!r} was being overwritten)")
                if name in self.exchanges:
                    self._persist(self.exchanges[name])
        for name, ex in list(self.exchanges.items()):
            held = [p for p in ex.producers.values() if p.location.get("service_id") in by_id]
            committed = set(ex.committed)
            gone = [p for p in held if p.partition in committed]
            if gone and not ex.stream:
                record = by_id[gone[0].location["service_id"]]
                await self._lose(name, f"exchange {name!r} was lost: {len(gone)} of its committed partitions were held "
                                       f"by {record.where()}, which was lost ({record.lost_reason}); the exchange's "
                                       "data went with it. Write the exchange again")
                continue
            for p in held:
                if p.state != PartitionState.FAILED:
                    record = by_id[p.location["service_id"]]
                    await self.producer_failed(name, ex.epoch, p.partition,
                                               f"{record.where()} was lost: {record.lost_reason}")

    async def _lose(self, name: str, message: str) -> None:
        ex = self.exchanges.pop(name)
        if self.journal is not None:
            self.journal.remove_exchange(name)
        self.lost[name] = {"at": time.time(), "message": message, "owner": ex.owner}
        self._names_changed()
        self._release_producers(list(ex.producers.values()), message, REPLACED)
        self._release_previous(name, message)
        await self._notify(None, name, reason=message)

    # ------------------------------------------------------------ the state directory (journal.py)
    async def restore(self, journal: Journal) -> int:
        """Take up the state a previous coordinator left in ``journal``; from now on keep it there.

        Writes that were open are aborted (their producers' registrations were not kept); services get
        a full heartbeatTimeout to register again. Returns the exchanges restored."""
        current = list(self.services.services.values())  # this process's own service, registered at start
        self.services.restore(journal.load_services())
        replaced = []
        for r in current:  # a predecessor at the same address is lost now: it was this process's predecessor
            replaced += self.services.register(r.service_id, r.host_id, r.tcp, r.unix, r.pid)
        for record in replaced:  # lost now: said once, here
            log.warning("%s is lost: %s", record.where(), record.lost_reason)
        self.lost.update(journal.load_lost())
        top_epoch = top_write = 0
        for record in journal.load_exchanges():
            try:
                ex = Exchange.from_record(record)
                if record.get("previous"):
                    self.previous[ex.name] = Exchange.from_record(record["previous"])
            except (KeyError, ValueError, TypeError) as exc:
                log.error("state directory: exchange record %r cannot be read (%s): skipped", record.get("name"), exc)
                continue
            self.exchanges[ex.name] = ex
            self.lost.pop(ex.name, None)
            top_epoch = max(top_epoch, ex.epoch)
            older = self.previous.get(ex.name)
            for write_id in [*ex.open_writes, *(p.write_id for v in (ex, older) if v is not None
                                                for p in v.producers.values())]:
                if write_id[1:].isdigit():
                    top_write = max(top_write, int(write_id[1:]))
        self._epochs = itertools.count(top_epoch + 1)
        self._writes = itertools.count(top_write + 1)
        self.journal = journal
        for ex in list(self.exchanges.values()):
            for write_id in sorted(ex.open_writes):
                await self.abort(ex.name, ex.epoch, write_id, "the coordinator restarted while this write was open "
                                 "(its producers' registrations are not kept); write it again")
        self._forget_lost()
        lost = [r for r in self.services.services.values() if r.state == ServiceState.LOST]
        if lost:  # each was logged when it was lost; one line says how many are still listed
            log.info("%d lost exchange services from before the restart are listed until lostServiceRetention "
                     "(%g s) after their loss", len(lost), self.lost_retention)
            await self.services_lost(lost, announce=False)
        self._names_changed()
        return len(self.exchanges)

    # ------------------------------------------------------------ reader side
    async def get_exchange(self, name: str, wait: float = 0.0, need_subpartitions: bool = False,
                           until_sealed: bool = False) -> dict:
        """The exchange's description, waiting up to ``wait`` s for it to be declared; ``until_sealed``: for an
        exchange that is declared, up to ``wait`` s for it to be sealed or aborted instead (a reader that reads
        committed exchanges only waits here, woken by the commit, rather than asking again and again)."""
        timeout = wait
        if name in self.lost and name not in self.exchanges:
            raise ServiceError(self.lost[name]["message"], ErrorCode.EXCHANGE_LOST)
        if self.is_stream(name):
            raise ServiceError(f"exchange {name!r} is a stream written by a streaming query: read it with "
                           "spark.readStream.format('pipelined')", ErrorCode.NOT_A_BATCH)

        def declared() -> bool:
            ex = self.exchanges.get(name)
            if ex is None and self.is_stream(name):
                return True
            return ex is not None and (not need_subpartitions or ex.num_subpartitions is not None or ex.state == ExchangeState.ABORTED)

        def ready() -> bool:
            ex = self.exchanges.get(name)
            if until_sealed:  # gone (dropped) or not declared: answered at once, as without a wait
                return ex is None or ex.sealed or ex.state == ExchangeState.ABORTED
            return declared()

        if not ready() and timeout > 0:
            try:
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait_for(ready), timeout)
            except asyncio.TimeoutError:
                pass
        if self.exchanges.get(name) is None and self.is_stream(name):
            raise ServiceError(f"exchange {name!r} is a stream written by a streaming query: read it with "
                           "spark.readStream.format('pipelined')", ErrorCode.NOT_A_BATCH)
        if self.exchanges.get(name) is None:
            raise ServiceError(
                f"exchange {name!r} does not exist (waited {timeout:g} s for a writer to declare it; "
                "check the name, or raise declareTimeout)", ErrorCode.NO_EXCHANGE)
        if not declared():
            if self.exchanges[name].coalesce:
                raise ServiceError(
                    f"exchange {name!r} does not know its number of subpartitions yet: without numSubpartitions the "
                    "first write task fixes it (spark.sql.shuffle.partitions of the writing session), and none "
                    f"registered within {timeout:g} s (declareTimeout); start the write, or set numSubpartitions",
                    ErrorCode.NO_SUBPARTITIONS)
            raise ServiceError(
                f"exchange {name!r} does not know its number of subpartitions yet (a forward/broadcast write "
                "without numSubpartitions fixes it at commit); set numSubpartitions on the writer to read while it writes",
                ErrorCode.NO_SUBPARTITIONS)
        return self._get(name).describe()

    def subscribe(self, name: str, callback: Callable[[dict], None], seal: int | None = None) -> Callable[[], None]:
        """The callback gets the full state now, then deltas (``producers`` changed, ``removed``, ``committed``).

        ``seal``: the reader was planned after that many seals (its description's ``seals``) and reads the
        next one; once that seal happened, the full state says which producers it holds (``read_state``)."""
        ex = self._get(name)
        self._subscribers.setdefault(name, set()).add(callback)
        full = {**ex.describe(), "full": True}
        state = ex.read_state(seal) if isinstance(seal, int) and not isinstance(seal, bool) else None
        if state is not None:
            full["read_state"] = state
        callback(full)

        def unsubscribe() -> None:
            subs = self._subscribers.get(name)
            if subs is not None:
                subs.discard(callback)
                if not subs:
                    del self._subscribers[name]
        return unsubscribe

    def list(self) -> list[dict]:
        """Batch exchanges (a stream's epochs are listed with their stream)."""
        return [ex.describe() for ex in self.exchanges.values() if not ex.stream]

    async def expire(self, abandoned_writes: bool = False) -> None:
        """Drop exchanges unused for ``ttl`` seconds (nobody reading, no write open); abort writes left open
        that long with no producer running (their job died before its commit or abort: readers waiting for
        them learn so, and the exchange can expire). ``abandoned_writes``: an open write counts as unused
        too (no application that could finish it is alive)."""
        if self.ttl <= 0:
            return
        wall = time.time()
        expired = [n for n, v in self.lost.items() if wall - v.get("at", wall) > self.ttl]
        for name in expired:
            del self.lost[name]
        if expired:
            self._names_changed()
        now = time.monotonic()
        for name, ex in list(self.exchanges.items()):
            if ex.stream:
                continue  # an epoch lives as long as its stream retains it (streams.py)
            if ex.open_writes and now - ex.last_used > self.ttl and \
                    not any(p.state == PartitionState.RUNNING for p in ex.producers.values() if p.write_id in ex.open_writes):
                for write_id in sorted(ex.open_writes):
                    await self.abort(name, ex.epoch, write_id,
                                     f"abandoned: neither committed nor aborted for ttl={self.ttl:g} s with no task "
                                     "writing (did the writing job end without committing?)")
                continue
            if (not ex.open_writes or abandoned_writes) and not self._subscribers.get(name) \
                    and now - ex.last_used > self.ttl:
                await self._drop(name, f"expired (unused for ttl={self.ttl:g} s)")


def _key_columns(schema_b64: str, keys: list[str]) -> list[object]:
    """The columns the keys name, as Spark resolves them: the exact name, else the one column of that name in
    another case (a JVM write may spell a key as the user did); a name resolving to no single column stays a name."""
    from ..buffer import schema_from_b64

    try:
        names = schema_from_b64(schema_b64).names
    except Exception:  # noqa: BLE001 - an unreadable schema: compare the names as given
        return list(keys)
    out: list[object] = []
    for key in keys:
        if key in names:
            out.append(names.index(key))
            continue
        folded = [i for i, n in enumerate(names) if n.lower() == str(key).lower()]
        out.append(folded[0] if len(folded) == 1 else key)
    return out


def same_layout(ex: Exchange, partitioner: dict, partition_type: str, num_subpartitions: int | None) -> bool:
    """An append writes the exchange's layout: its partitioner, the same key columns in the same order (hash,
    custom), its custom function, a broadcast's sharing, its partitionType and (when the write names one) its
    width. Readers plan on that layout, and the JVM reader tells Spark a hash exchange is grouped by its key."""
    held = ex.partitioner
    kind = held.get("name")
    if partitioner.get("name") != kind or ex.partition_type != partition_type:
        return False
    if kind in ("hash", "custom") and _key_columns(ex.schema, list(held.get("keys") or [])) != \
            _key_columns(ex.schema, list(partitioner.get("keys") or [])):
        return False
    if kind == "custom" and (held.get("custom") or None) != (partitioner.get("custom") or None):
        return False
    if kind == "broadcast" and bool(held.get("shared")) != bool(partitioner.get("shared")):
        return False
    return num_subpartitions is None or ex.num_subpartitions in (None, num_subpartitions)


def layout_text(partitioner: dict, partition_type: str, num_subpartitions: int | None) -> str:
    """A layout as an error message names it: ``hash(a, b) into 4 subpartitions, HYBRID``."""
    kind = str(partitioner.get("name"))
    keys = list(partitioner.get("keys") or [])
    text = kind + (f"({', '.join(map(str, keys))})" if keys and kind in ("hash", "custom") else "")
    if kind == "custom" and partitioner.get("custom"):
        text += f" [{partitioner.get('custom')}]"
    width = "an open width" if num_subpartitions is None else f"{num_subpartitions} subpartitions"
    if kind == "broadcast" and partitioner.get("shared"):
        width = "one shared subpartition per producer"
    return f"{text} into {width}, {partition_type}"


def same_schema(a_b64: str, b_b64: str) -> bool:
    """Two serialised Arrow schemas describe the same schema: the same bytes, or equal once read (Arrow Java and
    pyarrow serialise an equal schema to different bytes: a JVM write may append to a Python-written exchange,
    and the reverse)."""
    if a_b64 == b_b64:
        return True
    from ..buffer import schema_from_b64

    try:
        return schema_from_b64(a_b64).equals(schema_from_b64(b_b64), check_metadata=True)
    except Exception:  # noqa: BLE001 - an unreadable schema is another schema
        return False


def _schema_text(schema_b64: str) -> str:
    from ..buffer import schema_from_b64
    from ..spark_types import schema_text

    try:
        return schema_text(schema_from_b64(schema_b64))
    except Exception:  # noqa: BLE001 - only for the message
        return "<unreadable schema>"
