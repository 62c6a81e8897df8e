"""Test-only data sources: a sink that reports, per task, what Spark handed it (a SQL setting, batch sizes),
and a custom partitioner that reports the frozen heap of the worker our write task runs in."""
from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

PROBED_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"


@dataclass
class Seen(WriterCommitMessage):
    setting: str | None
    batch_rows: list


class ProbeSink(DataSource):
    """``format("probe_sink").option("out", path)``: the commit writes what every task saw to ``path`` as JSON."""

    @classmethod
    def name(cls) -> str:
        return "probe_sink"

    def writer(self, schema, overwrite):
        return _ProbeWriter(self.options["out"])


class _ProbeWriter(DataSourceArrowWriter):
    def __init__(self, out: str) -> None:
        self.out = out

    def write(self, iterator):
        from pyspark import TaskContext

        rows = [batch.num_rows for batch in iterator]
        return Seen(TaskContext.get().getLocalProperty(PROBED_KEY), rows)

    def commit(self, messages):
        with open(self.out, "w") as f:
            json.dump([{"setting": m.setting, "batch_rows": m.batch_rows} for m in messages], f)



def heap_probe_partitioner(batch, n):
    """A custom partitioner (it runs inside our write tasks, in their worker): appends "pid frozen-count" to the
    file named by the batch's ``probe`` column, and sends every row to subpartition 0."""
    import gc
    import os

    import numpy as np

    with open(batch.column("probe")[0].as_py(), "a") as f:
        f.write(f"{os.getpid()} {gc.get_freeze_count()}\n")
    return np.zeros(batch.num_rows, dtype=np.int64)
