"""An exchange's description as clients use it: the coordinator's reply, parsed once into typed fields.

The wire stays a JSON object (the coordinator's ``get_exchange``, a stream's ``stream_describe``, the
epochs of ``stream_plan``); :meth:`ExchangeDescription.parse` turns it into one frozen object that the read
path, the Spark glue and the plain-Python client pass along instead of a dict each of them reads and
amends. Spark plans a read in short-lived planning workers, so this module imports neither Arrow nor the
data path (the schema stays the base64 Arrow IPC message it was declared with; :attr:`arrow_schema`
decodes it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from .errors import ErrorCode, ServiceError
from .kinds import ExchangeKind, ExchangeState, Partitioner, PartitionType

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class PartitionerSpec:
    """The exchange's partitioner as its writer declared it."""

    name: Partitioner
    keys: tuple[str, ...] = ()
    custom: str | None = None  # module:function of a custom partitioner
    shared: bool = False  # a broadcast of unknown width: one subpartition that every reader reads

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> PartitionerSpec:
        raw = raw or {}
        return cls(Partitioner.of(raw.get("name") or Partitioner.HASH), tuple(raw.get("keys") or ()),
                   raw.get("custom"), bool(raw.get("shared")))


def _ints(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


@dataclass(frozen=True, slots=True)
class ExchangeDescription:
    """An exchange (or a stream) as the coordinator described it. Fields a stream's description lacks keep
    their defaults; ``producers`` are the coordinator's producer records (index, partition, state, location,
    spill), as a read gate reads them."""

    name: str
    schema: str  # base64 Arrow IPC schema message
    partitioner: PartitionerSpec
    partition_type: PartitionType
    state: ExchangeState
    kind: ExchangeKind = ExchangeKind.BATCH
    epoch: int = 0
    num_subpartitions: int | None = None
    sealed: bool = False  # committed: its producers are fixed
    seals: int | None = None  # how often it was sealed (appends seal again): a read planned now reads that seal
    seal_ends: tuple[int, ...] = ()
    open_writes: int = 0
    abort_reason: str | None = None
    coalesce: bool = False  # its width was not given: a read may coalesce subpartitions
    producers: tuple[dict, ...] = ()
    committed: tuple[str, ...] = ()  # partitions of the committed producers, in commit order
    subpartition_bytes: tuple[int, ...] | None = None  # once every committed producer reported its sizes
    # the same as they would be uncompressed: what read partitions decode to, so what read layouts size by
    subpartition_raw_bytes: tuple[int, ...] | None = None
    subpartition_rows: tuple[int, ...] | None = None
    rows: int | None = None
    owner: str = ""
    readers: tuple[str, ...] = ()  # who may read it besides its owner and the operator ("*": every credential)
    private: bool = False  # its readers are not every credential: its writers name them to the services holding it
    created_at: float | None = None
    last_used_at: float | None = None
    last_committed: int | None = None  # a stream's newest committed epoch
    # the coordinator's read verdict (sealed, live, writing, ended, code, reason): the JVM reader follows it
    readable: dict | None = None

    @property
    def layout_bytes(self) -> tuple[int, ...] | None:
        """Bytes per subpartition to size read partitions by: decoded (raw) where the coordinator reports them,
        else as stored."""
        return self.subpartition_raw_bytes if self.subpartition_raw_bytes is not None else self.subpartition_bytes

    @classmethod
    def parse(cls, reply: Mapping[str, Any]) -> ExchangeDescription:
        """The coordinator's description; a reply that is not one is a protocol error naming what is missing."""
        if not isinstance(reply, Mapping):
            raise ServiceError(f"the coordinator described an exchange as {type(reply).__name__}, not an object",
                               ErrorCode.PROTOCOL)
        missing = [k for k in ("name", "schema", "partition_type", "state") if reply.get(k) is None]
        if missing:
            raise ServiceError(f"the coordinator's description of exchange {reply.get('name')!r} lacks "
                               f"{', '.join(missing)}", ErrorCode.PROTOCOL)
        try:
            return cls(
                name=str(reply["name"]), schema=str(reply["schema"]),
                partitioner=PartitionerSpec.parse(reply.get("partitioner")),
                partition_type=PartitionType(reply["partition_type"]), state=ExchangeState(reply["state"]),
                kind=ExchangeKind(reply.get("kind") or ExchangeKind.BATCH), epoch=int(reply.get("epoch") or 0),
                num_subpartitions=reply.get("num_subpartitions"), sealed=bool(reply.get("sealed")),
                seals=reply.get("seals"), seal_ends=_ints(reply.get("seal_ends")) or (),
                open_writes=int(reply.get("open_writes") or 0), abort_reason=reply.get("abort_reason"),
                coalesce=bool(reply.get("coalesce")), producers=tuple(reply.get("producers") or ()),
                committed=tuple(reply.get("committed") or ()),
                subpartition_bytes=_ints(reply.get("subpartition_bytes")),
                subpartition_raw_bytes=_ints(reply.get("subpartition_raw_bytes")),
                subpartition_rows=_ints(reply.get("subpartition_rows")), rows=reply.get("rows"),
                owner=str(reply.get("owner") or ""), readers=tuple(reply.get("readers") or ()),
                private=bool(reply.get("private")), created_at=reply.get("created_at"),
                last_used_at=reply.get("last_used_at"), last_committed=reply.get("last_committed"),
                readable=dict(reply["readable"]) if isinstance(reply.get("readable"), Mapping) else None)
        except (TypeError, ValueError) as exc:
            raise ServiceError(f"the coordinator's description of exchange {reply.get('name')!r} is malformed: "
                               f"{exc}", ErrorCode.PROTOCOL) from None

    @property
    def arrow_schema(self) -> pa.Schema:
        """The schema, decoded (imports pyarrow)."""
        from .buffer import schema_from_b64

        return schema_from_b64(self.schema)

    def sealed_producers(self) -> list[dict] | None:
        """The committed producers of a description taken when the exchange was sealed (the read plan), else None."""
        if not self.sealed:
            return None
        committed = set(self.committed)
        return [p for p in self.producers if p["partition"] in committed]

    def replace(self, **changes: Any) -> ExchangeDescription:
        """A copy with ``changes`` (the read plan keeps fewer producers)."""
        return dataclasses.replace(self, **changes)
