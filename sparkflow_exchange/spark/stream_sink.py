"""``writeStream.format("pipelined")``: micro-batch ``batchId`` of the writer query is epoch ``batchId``.

Kept light at import (no pyarrow, no data path; a write task imports those when it writes): Spark
unpickles this writer and its tasks' commit messages in a fresh Python process for every
micro-batch's commit, so each import here is paid by every micro-batch (about 0.3-0.5 s for pyarrow
and the data path on this machine).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import DataSourceStreamArrowWriter

from ..buffer_kinds import epoch_marker
from . import streaming as st
from .spark_errors import user_errors
from .tasks import PartitionCommit, write_task

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ID = "streaming.sql.batchId"  # local properties Spark sets on every task of a micro-batch
QUERY_ID = "sql.streaming.queryId"  # the query's id, kept in its checkpoint across restarts


class PipelinedStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, handle: st.StreamHandle, options: dict | None = None) -> None:
        self.handle = handle
        self.options = options or {}

    @user_errors
    def write(self, iterator: Iterator["pa.RecordBatch"]) -> PartitionCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch, query = (ctx.getLocalProperty(BATCH_ID), ctx.getLocalProperty(QUERY_ID)) if ctx else (None, None)
        if batch is None or query is None:
            raise RuntimeError("a format('pipelined') stream write ran outside a micro-batch (no batch id)")
        handle = st.begin_epoch(self.handle, int(batch), query)
        if handle is None:  # a replay of an epoch committed already: its rows are in the stream once
            for _ in iterator:
                pass
            return PartitionCommit("", -1, 0)
        return write_task(handle, self.options, iterator, marker=epoch_marker(int(batch)))

    @user_errors
    def commit(self, messages: list[PartitionCommit | None], batchId: int) -> None:
        done = [m for m in messages if m is not None and m.partition]
        st.commit_epoch(self.handle, batchId, [m.partition for m in done], {m.partition: m.rows for m in done})

    def abort(self, messages: list[PartitionCommit | None], batchId: int) -> None:
        st.abort_epoch(self.handle, batchId, "the micro-batch failed")
