"""A test-only Arrow sink that reports, per task, what Spark handed it: a SQL setting and batch sizes."""
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
