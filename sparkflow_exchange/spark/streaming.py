"""Streams as clients see them: a writer query's epochs, a reader query's consumer group.

The service side is ``service/streams.py``. An epoch is written and read exactly as a batch exchange
(:mod:`sparkflow_exchange.exchange`); this module adds the calls around it: begin an epoch (or skip a
replay, or wait on backpressure), commit or abort it, join a group, find the newest epoch a trigger may
read, plan the epochs' reads, commit the group's position.

Light at import (no pyarrow, no data path; those are imported where a task writes or reads): Spark
unpickles a :class:`StreamHandle` in a fresh Python process for every micro-batch's commit.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Mapping

from ..buffer_kinds import epoch_marker
from ..calls import call, require_name
from ..config import ExchangeConfig
from ..description import ExchangeDescription
from ..errors import ExchangeError
from ..kinds import Partitioner

if TYPE_CHECKING:
    import pyarrow as pa

    from ..write_handle import WriteHandle

WAIT_ROUND = 5.0  # seconds one begin-epoch call waits on the service before the writer checks its deadline


@dataclass
class StreamHandle:
    """What a streaming writer hands to its tasks and commits with: the stream and this run of the query."""

    config: ExchangeConfig
    name: str
    schema_b64: str
    partitioner: Partitioner
    num_subpartitions: int | None
    run: str  # a token of one start of the writer query: a later run replaces a batch an earlier one left open

    def __post_init__(self) -> None:
        self.partitioner = Partitioner.of(self.partitioner)

    @property
    def width_open(self) -> bool:
        return self.num_subpartitions is None and not self.partitioner.single_subpartition


def live_flush(config: ExchangeConfig, options: Mapping[str, str]) -> tuple[ExchangeConfig, dict[str, str]]:
    """The stream writer's config and options: its tasks push what they hold after ``stream.bufferTimeout`` (1 ms by
    default), not the batch writer's ``bufferTimeout`` (100 ms), unless the write gives ``bufferTimeout`` as an
    option, as the JVM stream sink does: a Real-time Mode reader takes an epoch's rows as they are pushed. The
    option is named in the task's options too, so a session's batch ``bufferTimeout`` does not win in the task."""
    if any(key.lower() == "buffertimeout" for key in options):
        return config, dict(options)
    seconds = config.stream_buffer_timeout
    return config.replace(buffer_timeout=seconds), {**options, "bufferTimeout": repr(seconds)}


def declare_stream(config: ExchangeConfig, schema: "pa.Schema") -> StreamHandle:
    from .. import exchange as ex
    from ..buffer import schema_to_b64

    name = require_name(config)
    partitioner = ex.validate_write(config, schema)
    desc = ExchangeDescription.parse(call(config, "stream_declare", name=name, schema=schema_to_b64(schema),
                    num_subpartitions=config.num_subpartitions,
                    partitioner={"name": partitioner.value, "keys": list(config.keys), "custom": config.custom,
                                 "shared": False},
                    partition_type=config.partition_type,
                    coalesce=config.num_subpartitions is None and not partitioner.single_subpartition,
                    max_retained_bytes=config.stream_max_retained_bytes, groups=list(config.stream_consumer_groups),
                    **({"readers": list(config.readers)} if config.readers else {})))
    return StreamHandle(config, name, desc.schema, partitioner, desc.num_subpartitions, uuid.uuid4().hex)


def begin_epoch(handle: StreamHandle, epoch: int, query: str) -> "WriteHandle | None":
    """The write handle of micro-batch ``epoch``, or None when it was committed already (a replay).

    Waits while the stream retains more than ``stream.maxRetainedBytes``; fails after ``readerTimeout``
    without any consumer group moving on (a reader gone for good)."""
    from ..write_handle import WriteHandle

    config = handle.config
    deadline = time.monotonic() + config.reader_timeout
    last_position = None
    while True:
        left = max(0.0, deadline - time.monotonic())
        answer = call(config, "stream_begin_epoch", timeout=WAIT_ROUND + 30, name=handle.name, epoch=epoch,
                          query=query, run=handle.run, wait=min(WAIT_ROUND, left))
        if answer.get("skip"):
            return None
        waiting = answer.get("waiting")
        if waiting is None:
            return WriteHandle(config, answer["exchange"], answer["generation"], answer["write_id"],
                                  answer["schema"], answer["num_subpartitions"], handle.partitioner,
                                  tuple(answer.get("readers") or ()) if answer.get("private") else None)
        position = (waiting["released_upto"], tuple(sorted((g, v["position"]) for g, v in waiting["groups"].items())))
        if position != last_position:  # a reader moved on: wait another readerTimeout for the next one
            last_position = position
            deadline = time.monotonic() + config.reader_timeout
        elif time.monotonic() >= deadline:
            groups = ", ".join(f"{g} at epoch {v['position']} (idle {v['idle_s']:.0f} s)"
                               for g, v in waiting["groups"].items()) or "none registered"
            raise ExchangeError(
                f"stream {handle.name!r}: micro-batch {epoch} waited {config.reader_timeout:g} s (readerTimeout) for "
                f"its readers: the stream retains {waiting['retained_bytes']} bytes in {waiting['retained_epochs']} "
                f"epochs, more than stream.maxRetainedBytes={waiting['max_retained_bytes']}, and no consumer group "
                f"moved on (groups: {groups}); start the reader query, or drop a group that is gone for good "
                "with sparkflow_exchange.leave_group(name, group)")


def commit_epoch(handle: StreamHandle, epoch: int, partitions: list[str], rows: dict[str, int]) -> dict:
    return call(handle.config, "stream_commit_epoch", name=handle.name, epoch=epoch, partitions=partitions,
                rows=rows)


def abort_epoch(handle: StreamHandle, epoch: int, reason: str = "") -> None:
    try:
        call(handle.config, "stream_abort_epoch", name=handle.name, epoch=epoch, reason=reason)
    except ExchangeError:
        pass


# ------------------------------------------------------------------ reader side
def describe_stream(config: ExchangeConfig) -> ExchangeDescription:
    """The stream (schema, width...), waiting up to declareTimeout for a writer query to declare it."""
    name = require_name(config)
    return ExchangeDescription.parse(call(config, "stream_describe", timeout=config.declare_timeout + 30, name=name,
                                          wait=config.declare_timeout))


def join_group(config: ExchangeConfig, group: str | None = None) -> dict:
    """``{"group", "position"}`` of the reader query's group (a new group starts at ``startingEpochs``)."""
    return call(config, "stream_join", name=config.exchange, group=group or config.consumer_group,
                    start=config.starting_epochs)


def latest_epoch(config: ExchangeConfig, group: str, after: int, *, max_rows: int | None = None,
                 max_bytes: int | None = None, upto: int | None = None, wait: float = 0.0) -> dict:
    """``{"epoch", "last_committed"}``: the newest epoch a trigger may read; with none after ``after``,
    the service waits up to ``wait`` s for the next commit (``stream.pollWait``)."""
    return call(config, "stream_latest", timeout=wait + 30 if wait else None, name=config.exchange, group=group,
                    after=after, max_epochs=config.max_epochs_per_trigger, max_rows=max_rows, max_bytes=max_bytes,
                    upto=upto, wait=wait)


def plan_epochs(config: ExchangeConfig, after: int, upto: int) -> dict:
    return call(config, "stream_plan", name=config.exchange, after=after, upto=upto)


def commit_group(config: ExchangeConfig, group: str, epoch: int) -> dict:
    return call(config, "stream_commit_group", name=config.exchange, group=group, epoch=epoch)


def leave_group(config: ExchangeConfig, group: str) -> dict:
    return call(config, "stream_leave", name=config.exchange, group=group)


def epoch_plans(plan: dict) -> list[dict]:
    """The epochs of a ``stream_plan`` answer, each description parsed (an epoch's is sent without the schema,
    which is the stream's)."""
    return [{**e, "desc": ExchangeDescription.parse({**e["desc"], "schema": plan["schema"]})} for e in plan["epochs"]]


def read_epochs(config: ExchangeConfig, schema: "pa.Schema", plans: list[dict], index: int) -> Iterator["pa.RecordBatch"]:
    """Subpartition ``index`` of every producer of each planned epoch, epoch after epoch (``plans``: as
    :func:`epoch_plans` makes them, or as ``stream_plan`` sends them, the stream's ``schema`` then theirs)."""
    from .. import exchange as ex
    from ..buffer import schema_to_b64

    schema_b64 = None
    for plan in plans:
        desc = plan["desc"]
        if not isinstance(desc, ExchangeDescription):
            schema_b64 = schema_b64 or schema_to_b64(schema)
            desc = ExchangeDescription.parse({**desc, "schema": schema_b64})
        yield from ex.read_subpartition(config, desc, index, marker=epoch_marker(plan["epoch"]))
