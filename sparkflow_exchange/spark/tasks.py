"""What a Spark task learns from its TaskContext, and the write task itself.

Light at import (the data path is imported when a task writes): the streaming sink's per-micro-batch
commit process unpickles :class:`PartitionCommit` messages, and what this module imports is paid by
every micro-batch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import WriterCommitMessage

from ..config import PREFIX, TASK_KEYS, ConfigError
from .worker_heap import freeze_after_first

if TYPE_CHECKING:
    import pyarrow as pa

    from ..write_handle import WriteHandle

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@dataclass
class PartitionCommit(WriterCommitMessage):
    """A write task's result partition (``partition`` "" for a task that skipped a replayed epoch)."""

    partition: str
    index: int
    rows: int


def task_session() -> dict[str, str]:
    """The session settings of :data:`TASK_KEYS` as this task sees them (Spark's local properties)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return {}
    found = {PREFIX + k: ctx.getLocalProperty(PREFIX + k) for k in TASK_KEYS}
    return {k: v for k, v in found.items() if v is not None}


def task_attempt() -> tuple[int, str]:
    from pyspark import TaskContext

    from ..exchange import attempt_id

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("format('pipelined') write called outside a Spark task")
    return ctx.partitionId(), attempt_id(ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId())


def session_shuffle_partitions(default: int) -> int:
    """The writing session's spark.sql.shuffle.partitions (tasks see session settings as local properties)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty(SHUFFLE_PARTITIONS) if ctx is not None else None
    if not value:
        return default
    try:
        width = int(value)
    except ValueError:
        raise ConfigError(f"{SHUFFLE_PARTITIONS}={value!r} is not a number of partitions") from None
    if width < 1:
        raise ConfigError(f"{SHUFFLE_PARTITIONS}={width} must be at least 1 to be the exchange's width")
    return width


def write_task(handle: "WriteHandle", options: dict, iterator: Iterator["pa.RecordBatch"],
               marker: bytes | None = None) -> PartitionCommit:
    """One write task: its result partition, written and finished (or failed and released); ``marker``: a
    stream's epoch marker, after the data of every subpartition."""
    index, attempt = task_attempt()
    handle = dataclasses.replace(handle, config=handle.config.for_task(options, task_session()))
    result = _produce(handle, index, attempt, iterator, marker)
    # the task's writer objects are garbage by now (some in cycles): the freeze's collection takes them
    freeze_after_first("write", handle.config.freeze_worker_heap)
    return PartitionCommit(result["partition"], index, result["rows"])


def _produce(handle: "WriteHandle", index: int, attempt: str, iterator: Iterator["pa.RecordBatch"],
             marker: bytes | None) -> dict:
    from .. import exchange as ex

    width = session_shuffle_partitions(ex.DEFAULT_SHUFFLE_PARTITIONS) if handle.width_open else None
    producer = ex.ProducerTask(handle, index, attempt, num_subpartitions=width)
    try:
        producer.write(iterator)
        return producer.finish(marker)
    except BaseException as exc:
        producer.fail(f"{type(exc).__name__}: {exc}")
        raise
