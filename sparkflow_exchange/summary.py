"""What ``list_exchanges()`` tells a user about an exchange: a summary, not the coordinator's record.

The coordinator describes an exchange with everything its readers need (a base64 Arrow schema, every
producer with its location and spill file, per-subpartition sizes). Users and the ``list`` command get
this instead: the schema as a Spark DDL string, counts, sizes and times, stable across versions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from .description import ExchangeDescription
from .kinds import ExchangeKind, ExchangeState, Partitioner, PartitionType


@dataclass(frozen=True)
class StreamSummary:
    """A stream's progress: its last committed epoch, what it retains and where its consumer groups are."""

    last_committed: int  # -1 before the first epoch commits
    retained_epochs: int
    writer_waiting_s: float | None  # the writer has waited this long for maxRetainedBytes to free up, else None
    groups: Mapping[str, int] = field(default_factory=dict)  # consumer group -> the last epoch it is done with


@dataclass(frozen=True)
class ExchangeSummary:
    """One exchange (or stream) the coordinator holds."""

    name: str
    kind: ExchangeKind
    state: ExchangeState
    schema: str  # Spark DDL, as ``spark.read.schema(...)`` and ``StructType.fromDDL`` take it
    partition_type: PartitionType
    partitioner: Partitioner
    keys: tuple[str, ...]
    num_subpartitions: int | None  # None until the first producer fixes a width left to Spark
    producers: int  # committed producers (a stream: 0)
    rows: int | None  # committed rows (a stream: the rows of its retained epochs); None when not all were reported
    bytes: int | None  # bytes of the committed producers (a stream: its retained epochs); None when not all reported
    owner: str  # the name of the credential that declared it (docs/deployment.md, "Credentials and owners")
    created: datetime  # UTC: when this version was declared (an overwrite declares a new one)
    last_used: datetime  # UTC: the last write, read or commit; the exchange expires ``ttl`` seconds after it
    stream: StreamSummary | None = None  # for a stream (kind STREAM) only
    # ``bytes`` as they would be uncompressed (equal to it without compression); None when not every committed
    # producer reported it (a writer older than this field) and for a stream
    raw_bytes: int | None = None

    @classmethod
    def from_description(cls, desc: Mapping[str, Any]) -> ExchangeSummary:
        """The summary of a coordinator's description of an exchange or a stream."""
        from .spark_types import schema_ddl

        parsed = ExchangeDescription.parse(desc)
        stream = None
        if parsed.kind is ExchangeKind.STREAM:  # a stream's retention and groups: its status, not its description
            stream = StreamSummary(desc["last_committed"], desc["retained_epochs"], desc.get("writer_waiting_s"),
                                   {g: v["position"] for g, v in desc.get("groups", {}).items()})
            producers, rows, size = 0, desc.get("retained_rows"), desc.get("retained_bytes")
            raw = None
        else:
            sizes = parsed.subpartition_bytes
            producers, rows, size = len(parsed.committed), parsed.rows, None if sizes is None else sum(sizes)
            committed = set(parsed.committed)
            raws = [p.get("raw_bytes", -1) for p in parsed.producers if p.get("partition") in committed]
            raw = sum(raws) if raws and min(raws) >= 0 and size is not None else None
        return cls(
            name=parsed.name, kind=parsed.kind, state=parsed.state, schema=schema_ddl(parsed.arrow_schema),
            partition_type=parsed.partition_type, partitioner=parsed.partitioner.name, keys=parsed.partitioner.keys,
            num_subpartitions=parsed.num_subpartitions, producers=producers, rows=rows, bytes=size,
            owner=parsed.owner, created=_utc(parsed.created_at), last_used=_utc(parsed.last_used_at), stream=stream,
            raw_bytes=raw)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values: enums as their strings, times as ISO 8601 (``list --json`` prints this)."""
        out: dict[str, Any] = {
            "name": self.name, "kind": str(self.kind), "state": str(self.state), "schema": self.schema,
            "partition_type": str(self.partition_type), "partitioner": str(self.partitioner), "keys": list(self.keys),
            "num_subpartitions": self.num_subpartitions, "producers": self.producers, "rows": self.rows,
            "bytes": self.bytes, "raw_bytes": self.raw_bytes, "owner": self.owner, "created": self.created.isoformat(),
            "last_used": self.last_used.isoformat(),
        }
        if self.stream is not None:
            out["stream"] = {"last_committed": self.stream.last_committed,
                             "retained_epochs": self.stream.retained_epochs,
                             "writer_waiting_s": self.stream.writer_waiting_s, "groups": dict(self.stream.groups)}
        return out


def _utc(seconds: float | None) -> datetime:
    """A wall-clock time from the service (seconds since the Unix epoch; 0 when it sent none)."""
    return datetime.fromtimestamp(seconds or 0.0, tz=timezone.utc)
