"""The coordinator's model of an exchange: its producers, what was committed, its seals, and its lifecycle.

An :class:`Exchange` is one version of a named exchange (a batch exchange, or one epoch of a stream);
its state and open writes are its :class:`~.exchange_lifecycle.Lifecycle`, which says which event it may
take next. Plain data: the coordinator's roles (``service/coordinator.py``) change it.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode, ServiceError
from ..kinds import ExchangeState, Partitioner, PartitionState
from ..network.auth import EVERYONE
from .clock import wall_time
from .exchange_lifecycle import Kind, Lifecycle, ReplicaState, read_verdict

if TYPE_CHECKING:
    import numpy as np  # imported where sizes arrive: the service is ready about 45 ms sooner without it

# one subpartition per producer (the contract's single-subpartition partitioners); N may be fixed at commit
FORWARD_LIKE = tuple(p.value for p in Partitioner if p.single_subpartition)
MAX_READERS = 256  # credentials one readers list may name


def checked_readers(readers: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """A readers list as an exchange keeps it: names of credentials (or ``*``), each once, in the given order."""
    out: list[str] = []
    for name in readers:
        name = name.strip()
        if not name or any(c.isspace() or c == "," for c in name):
            raise ServiceError(f"readers names credentials ('*' for every one), separated by commas; {name!r} is not a "
                               "credential name", ErrorCode.BAD_REQUEST)
        if name not in out:
            out.append(name)
    if len(out) > MAX_READERS:
        raise ServiceError(f"readers names {len(out)} credentials; at most {MAX_READERS} may be named",
                           ErrorCode.BAD_REQUEST)
    return tuple(out)



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
    # copies of its partition (same partition id) on services of other hosts: {"location": ..., "state": ReplicaState}
    replicas: list[dict] = field(default_factory=list)
    failed_over: int = 0  # times a replica took the place of its partition (its service was lost)

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
    producers: dict[str, ProducerInfo] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    created: float = field(default_factory=time.time)  # wall clock: when this version of the exchange was declared
    coalesce: bool = False  # the width was not given: fixed by the first producer, reads may coalesce
    # per producer: bytes it wrote to each subpartition (reported at finish); summed over the committed at commit
    sizes: dict[str, np.ndarray] = field(default_factory=dict)
    # per producer that reported them: those bytes as they would be uncompressed (a compressed exchange's batches
    # are compressed or not each on its own, so a producer's subpartitions decode to different multiples of them)
    raw_sizes: dict[str, np.ndarray] = field(default_factory=dict)
    committed_bytes: np.ndarray | None = None
    # those bytes as they would be uncompressed (each producer's reported raw sizes, or its bytes scaled by its raw /
    # stored ratio when it reported none): what a read partition holds once decoded, which read layouts size by;
    # equal to committed_bytes when nothing is compressed
    committed_raw_bytes: np.ndarray | None = None
    # per producer: rows it wrote to each subpartition (reported at finish); summed like the sizes. Clients
    # outside Spark (a training loop's ranks) plan equal shares from them before reading a row
    row_counts: dict[str, np.ndarray] = field(default_factory=dict)
    committed_sub_rows: np.ndarray | None = None
    sizes_complete: bool = True  # every committed producer reported its sizes
    committed_rows: int | None = 0  # rows of the committed producers (None once one did not report its rows)
    stream: str = ""  # the stream this exchange is an epoch of (service/streams.py), "" for a batch exchange
    owner: str = ""  # the credential that declared it (service/owners.py); a stream's epoch: the stream's
    replicas: int = 0  # copies of each partition on other hosts' services (the replicas option)
    # the credentials that may read it besides its owner and the operator (the readers option); "*": every one
    readers: tuple[str, ...] = (EVERYONE,)
    # len(committed) at each seal (no write open any more, after a commit or an abort): the states a read
    # planned while writes were open may see; such a read reads the first seal after its planning
    seal_ends: list[int] = field(default_factory=list)
    _producer_dicts: dict[str, dict] = field(default_factory=dict)  # describe() cache, kept per producer
    life: Lifecycle | None = None  # its state and open writes (a new one: open, no write yet)

    def __post_init__(self) -> None:
        if self.life is None:
            self.life = Lifecycle(self.name, Kind.EPOCH if self.stream else Kind.BATCH)

    @property
    def state(self) -> ExchangeState:
        return self.life.state

    @property
    def open_writes(self) -> set[str]:
        return self.life.open_writes

    @property
    def commits(self) -> int:
        return self.life.commits

    @property
    def abort_reason(self) -> str:
        return self.life.reason if self.life.state is ExchangeState.ABORTED else ""

    def set_producer(self, p: ProducerInfo) -> dict:
        """Store (or update) a producer; returns its description, cached for describe()."""
        self.producers[p.partition] = p
        d = self._producer_dicts[p.partition] = p.to_dict()
        return d

    def remove_producer(self, partition: str) -> None:
        self.producers.pop(partition, None)
        self._producer_dicts.pop(partition, None)
        self.sizes.pop(partition, None)
        self.raw_sizes.pop(partition, None)
        self.row_counts.pop(partition, None)

    @property
    def sealed(self) -> bool:
        return self.life.sealed

    def verdict(self) -> dict[str, Any]:
        """Whether it may be read (the lifecycle's verdict, which every reader follows)."""
        committed = [(p.index, p.partition, p.state) for p in map(self.producers.get, self.committed) if p is not None]
        return read_verdict(self.life, self.num_subpartitions, committed).to_dict()

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
            "raw_sizes": {k: v.tolist() for k, v in self.raw_sizes.items()},
            "row_counts": {k: v.tolist() for k, v in self.row_counts.items()},
            "committed_bytes": listed(self.committed_bytes), "committed_raw_bytes": listed(self.committed_raw_bytes),
            "committed_sub_rows": listed(self.committed_sub_rows),
            "sizes_complete": self.sizes_complete, "committed_rows": self.committed_rows, "owner": self.owner,
            "seal_ends": list(self.seal_ends), "created": self.created, "replicas": self.replicas,
            "readers": list(self.readers),
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> "Exchange":
        import numpy as np

        def array(v: list[int] | None) -> np.ndarray | None:
            return None if v is None else np.asarray(v, dtype=np.int64)

        life = Lifecycle(r["name"], Kind.BATCH, ExchangeState(r["state"]), set(r["open_writes"]), int(r["commits"]),
                         reason=r["abort_reason"])
        ex = cls(r["name"], int(r["epoch"]), r["schema"], r["num_subpartitions"], r["partitioner"],
                 r["partition_type"], life=life, committed=list(r["committed"]), coalesce=bool(r["coalesce"]), sizes={k: array(v) for k, v in r["sizes"].items()},
                 raw_sizes={k: array(v) for k, v in r.get("raw_sizes", {}).items()},
                 row_counts={k: array(v) for k, v in r["row_counts"].items()},
                 committed_bytes=array(r["committed_bytes"]), committed_raw_bytes=array(r.get("committed_raw_bytes")),
                 committed_sub_rows=array(r["committed_sub_rows"]),
                 sizes_complete=bool(r["sizes_complete"]), committed_rows=r["committed_rows"], owner=r["owner"],
                 seal_ends=list(r["seal_ends"]), replicas=int(r.get("replicas", 0)),
                 readers=tuple(r.get("readers", (EVERYONE,))))
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
            "readable": self.verdict(),  # whether and how it may be read: readers follow this, never the state
            "seals": len(self.seal_ends),
            "seal_ends": list(self.seal_ends),  # len(committed) at each seal: what a read planned before it reads
            "open_writes": len(self.open_writes),
            "abort_reason": self.abort_reason,
            "coalesce": self.coalesce,
            "producers": list(self._producer_dicts.values()),
            "committed": list(self.committed),
            "subpartition_bytes": self.subpartition_bytes(),
            "subpartition_raw_bytes": self.subpartition_raw_bytes(),
            "rows": self.committed_rows,
            "subpartition_rows": self.subpartition_rows(),
            "owner": self.owner,
            "readers": list(self.readers),
            "private": EVERYONE not in self.readers,  # its writers name its readers to the services holding it
            "replicas": self.replicas,
            "replication": self.replication(),
            "created_at": self.created,
            "last_used_at": wall_time(self.last_used),
        }

    def replication(self) -> dict[str, int] | None:
        """Its committed partitions' copies, for status and the metrics: how many have every replica asked for
        complete (``replicated``), fewer (``under_replicated``: a replica's service was lost), and how many are read
        from a replica that took a lost partition's place (``failed_over``). None without replicas."""
        if not self.replicas:
            return None
        out = {"partitions": 0, "replicated": 0, "under_replicated": 0, "failed_over": 0}
        for p in map(self.producers.get, self.committed):
            if p is None:
                continue
            out["partitions"] += 1
            complete = sum(1 for r in p.replicas if r.get("state") == ReplicaState.COMPLETE)
            out["replicated" if complete >= self.replicas else "under_replicated"] += 1
            out["failed_over"] += bool(p.failed_over)
        return out

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

    def subpartition_raw_bytes(self) -> list[int] | None:
        """:meth:`subpartition_bytes` as they would be uncompressed: what read layouts size by (a compressed
        exchange's stored bytes are a fraction of what its read partitions decode to)."""
        if self.committed_raw_bytes is None or not self.sizes_complete:
            return None
        return self.committed_raw_bytes.tolist()

    def subpartition_rows(self) -> list[int] | None:
        """Rows per subpartition over the committed producers, when all of them reported theirs."""
        if self.committed_sub_rows is None or not self.sizes_complete:
            return None
        return self.committed_sub_rows.tolist()



def key_columns(schema_b64: str, keys: list[str]) -> list[object]:
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
    if kind in ("hash", "custom") and key_columns(ex.schema, list(held.get("keys") or [])) != \
            key_columns(ex.schema, list(partitioner.get("keys") or [])):
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


def schema_text(schema_b64: str) -> str:
    from ..buffer import schema_from_b64
    from ..spark_types import schema_text

    try:
        return schema_text(schema_from_b64(schema_b64))
    except Exception:  # noqa: BLE001 - only for the message
        return "<unreadable schema>"
