"""The strict floor of ``first_use.py``: a no-op Python data source whose module imports nothing but
pyspark's data source API.

Spark imports a data source's module in every short-lived planning worker (lookup, write, commit, schema,
read plan); this source pays for nothing there beyond what Spark itself loads. Arrow is imported where
rows move (``write``/``read`` in executor workers), as ``format("pipelined")`` does. Its sink drops every
batch; its source yields the prepared Arrow IPC files of ``spark_common.prepare_floor_files``.
Workers import this module: ``spark_common.bench_environment`` puts ``benchmarks/`` on ``PYTHONPATH``.
"""
from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

SCHEMA = "id long, key long, s string, d double"


class BareSink(DataSource):
    """Receives every Arrow batch and drops it."""

    @classmethod
    def name(cls) -> str:
        return "bare_sink"

    def writer(self, schema, overwrite):
        return BareWriter()


class BareWriter(DataSourceArrowWriter):
    def write(self, iterator):
        return self.drain(iterator)

    @staticmethod
    def drain(iterator):
        for _batch in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages):
        pass


class BareSource(DataSource):
    """Options ``dir`` and ``parts``; yields part-<i>.arrow's batches in partition i."""

    @classmethod
    def name(cls) -> str:
        return "bare_source"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return BareReader(self.options["dir"], int(self.options["parts"]))


class BareSplit(InputPartition):
    def __init__(self, index: int) -> None:
        self.index = index


class BareReader(DataSourceReader):
    def __init__(self, directory: str, parts: int) -> None:
        self.directory = directory
        self.parts = parts

    def partitions(self):
        return [BareSplit(i) for i in range(self.parts)]

    def read(self, partition):
        return self.batches(partition)

    def batches(self, partition):
        import pyarrow as pa

        with pa.memory_map(f"{self.directory}/part-{partition.index}.arrow") as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
