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
        return PipelinedReader(self.config, desc)

    def writer(self, schema: StructType, overwrite: bool) -> "PipelinedWriter":
        handle = ex.declare_write(self.config, _arrow_schema(schema), overwrite)
        return PipelinedWriter(handle)


@dataclass
class SubpartitionSplit(InputPartition):
    index: int


class PipelinedReader(DataSourceReader):
    def __init__(self, config: ExchangeConfig, desc: dict) -> None:
        self.config = config
        self.desc = desc

    def partitions(self) -> list[SubpartitionSplit]:
        return [SubpartitionSplit(i) for i in range(self.desc["num_subpartitions"])]

    def read(self, partition: SubpartitionSplit) -> Iterator[pa.RecordBatch]:
        return ex.read_subpartition(self.config, self.desc, partition.index)


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
        producer = ex.ProducerTask(self.handle, index, attempt)
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
