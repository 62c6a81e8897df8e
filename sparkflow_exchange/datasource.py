"""The Spark glue: ``format("pipelined")`` as a Python data source. Thin by design.

Where each piece runs (PYSPARK-NOTES.md): ``schema``/``reader``/``writer``
in short-lived planning workers on the driver, ``read``/``write`` in executor
workers, ``commit``/``abort`` on the writer pickled at planning time. Settings
arrive as options plus spark-defaults.conf; shared state lives in the service.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from . import exchange as ex
from .config import ConfigError, ExchangeConfig
from .consumer.read_plan import read_ranges

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _describe(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" + ("" if f.nullable else " not null") for f in schema) + ")"


def _task_attempt() -> tuple[int, str]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("format('pipelined') write called outside a Spark task")
    return ctx.partitionId(), ex.attempt_id(ctx.partitionId(), ctx.attemptNumber(), ctx.taskAttemptId())


def _session_shuffle_partitions() -> int:
    """The writing session's spark.sql.shuffle.partitions (tasks see session settings as local properties)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty(SHUFFLE_PARTITIONS) if ctx is not None else None
    if not value:
        return ex.DEFAULT_SHUFFLE_PARTITIONS
    try:
        width = int(value)
    except ValueError:
        raise ConfigError(f"{SHUFFLE_PARTITIONS}={value!r} is not a number of partitions") from None
    if width < 1:
        raise ConfigError(f"{SHUFFLE_PARTITIONS}={width} must be at least 1 to be the exchange's width")
    return width


class PipelinedDataSource(DataSource):
    """``spark.read/df.write.format("pipelined")``: Flink's data exchange between Spark jobs and applications."""

    @classmethod
    def name(cls) -> str:
        return "pipelined"

    def __init__(self, options: dict) -> None:
        super().__init__(options)
        self.config = ExchangeConfig.load(dict(options))

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(ex.describe_exchange(self.config)["arrow_schema"])

    def reader(self, schema: StructType) -> "PipelinedReader":
        desc = ex.describe_exchange(self.config)
        expected = desc["arrow_schema"]
        given = _arrow_schema(schema)
        if not given.equals(expected):
            raise ConfigError(
                f"the given schema does not match exchange {self.config.exchange!r}: given {_describe(given)}, "
                f"exchange has {_describe(expected)}")
        desc.pop("arrow_schema")
        return PipelinedReader(self.config, _read_plan(desc))

    def writer(self, schema: StructType, overwrite: bool) -> "PipelinedWriter":
        handle = ex.declare_write(self.config, _arrow_schema(schema), overwrite)
        return PipelinedWriter(handle)


def _read_plan(desc: dict) -> dict:
    """What read tasks need of the description. Sealed: the committed producers (the read plan; the reader
    object travels once per stage in Spark's task binary, the InputPartitions per task, so the producers
    live here and a partition is just its range). Not sealed: no producers, the gate subscribes."""
    producers = ex.sealed_producers(desc)
    plan = {k: v for k, v in desc.items() if k not in ("producers", "committed")}
    if producers is not None:
        plan["producers"] = producers
        plan["committed"] = [p["partition"] for p in producers]
    return plan


@dataclass
class SubpartitionSplit(InputPartition):
    """Read subpartitions [index, end) of every producer (end None: just ``index``)."""

    index: int
    end: int | None = None


class PipelinedReader(DataSourceReader):
    def __init__(self, config: ExchangeConfig, desc: dict) -> None:
        self.config = config
        self.desc = desc

    def partitions(self) -> list[SubpartitionSplit]:
        ranges = read_ranges(self.desc, self.config.advisory_partition_size)
        return [SubpartitionSplit(s, None if e == s + 1 else e) for s, e in ranges]

    def read(self, partition: SubpartitionSplit) -> Iterator[pa.RecordBatch]:
        return ex.read_subpartition(self.config, self.desc, partition.index, partition.end)


@dataclass
class PartitionCommit(WriterCommitMessage):
    partition: str
    index: int
    rows: int


class PipelinedWriter(DataSourceArrowWriter):
    def __init__(self, handle: ex.WriteHandle) -> None:
        self.handle = handle

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionCommit:
        index, attempt = _task_attempt()
        width = _session_shuffle_partitions() if self.handle.width_open else None
        producer = ex.ProducerTask(self.handle, index, attempt, num_subpartitions=width)
        try:
            producer.write(iterator)
            result = producer.finish()
        except BaseException as exc:
            producer.fail(f"{type(exc).__name__}: {exc}")
            raise
        return PartitionCommit(result["partition"], index, result["rows"])

    def commit(self, messages: list[PartitionCommit | None]) -> None:
        ex.commit_write(self.handle, [m.partition for m in messages if m is not None])

    def abort(self, messages: list[PartitionCommit | None]) -> None:
        ex.abort_write(self.handle, "the Spark write job failed")
