"""The record writer: routes a task's Arrow batches to subpartitions and cuts them into buffers.

Flink's RecordWriter + ChannelSelector + the output flusher. Rows are routed
with a vectorised selector and sliced per subpartition (no per-row Python);
slices gather per subpartition until ``bufferSize`` bytes, then become one
buffer. An output flusher thread sends partly filled buffers every
``bufferTimeout``, so a trickle of rows reaches a running consumer in time.

``forward`` partitions have one subpartition: a forward producer's output is
its consumer's whole input. A ``broadcast`` buffer is serialised once and
pushed once; the service stores it once and every subpartition refers to it
(with no numSubpartitions known, one shared subpartition serves every reader).
"""
from __future__ import annotations

import threading
from typing import Iterable

import pyarrow as pa

from ..buffer import BatchEncoder
from ..network.protocol import BROADCAST
from .partition_writer import PartitionWriter
from .selectors import make_selector, split_by_target

SINGLE_SUBPARTITION = ("forward", "broadcast")


class SchemaMismatchError(ValueError):
    pass


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Relabel what Spark hands a writer (session time zone, large strings) to the exchange's schema."""
    if batch.schema.equals(schema):
        return batch
    if batch.num_columns != len(schema):
        raise SchemaMismatchError(f"batch has {batch.num_columns} columns, the exchange's schema has {len(schema)}")
    columns = []
    for column, field in zip(batch.columns, schema):
        if not field.nullable and column.null_count:
            raise SchemaMismatchError(f"column {field.name!r} is declared not null but holds {column.null_count} nulls")
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class RecordWriter:
    def __init__(self, writer: PartitionWriter, schema: pa.Schema, partitioner: str, num_subpartitions: int,
                 producer_index: int, *, keys: tuple[str, ...] = (), buffer_size: int = 1 << 20,
                 buffer_timeout: float = 0.1, compression: str = "none", num_producers: int | None = None,
                 custom: str | None = None) -> None:
        self.writer = writer
        self.schema = schema
        self.encoder = BatchEncoder(schema, compression)
        self.buffer_size = buffer_size
        self.single = partitioner in SINGLE_SUBPARTITION
        self.n = 1 if self.single else num_subpartitions
        # the subpartition index each accumulator pushes to
        self.targets = [BROADCAST if partitioner == "broadcast" and num_subpartitions > 1 else 0] if self.single \
            else list(range(self.n))
        self.selector = None if self.single else make_selector(
            partitioner, num_subpartitions, producer_index, schema, keys=keys, num_producers=num_producers,
            custom=custom)
        self.pending: list[list[pa.RecordBatch]] = [[] for _ in range(self.n)]
        self.pending_bytes = [0] * self.n
        self.rows = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flush_error: BaseException | None = None
        if buffer_timeout > 0:
            self._flusher = threading.Thread(target=self._flush_loop, args=(buffer_timeout,),
                                             name="sparkflow-output-flusher", daemon=True)
            self._flusher.start()

    def write(self, batch: pa.RecordBatch) -> None:
        if self._flush_error is not None:
            raise self._flush_error
        if batch.num_rows == 0:
            return
        batch = conform(batch, self.schema)
        self.rows += batch.num_rows
        if self.single:
            parts: Iterable[tuple[int, pa.RecordBatch]] = [(0, batch)]
        else:
            targets = self.selector.select(batch)
            parts = [(i, p) for i, p in enumerate(split_by_target(batch, targets, self.n)) if p is not None]
        with self._lock:
            for sub, part in parts:
                size = part.nbytes  # not free for a slice: asked once per slice
                if self.pending[sub] and self.pending_bytes[sub] + size > self.buffer_size:
                    self._push_pending(sub)
                if size >= self.buffer_size:
                    part, size = self._push_whole_buffers(sub, part, size)
                if part is not None:
                    self.pending[sub].append(part)
                    self.pending_bytes[sub] += size

    def write_all(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.write(batch)

    def _push(self, sub: int, batch: pa.RecordBatch) -> None:
        self.writer.push_batch(self.targets[sub], batch, self.encoder)

    def _push_whole_buffers(self, sub: int, batch: pa.RecordBatch, size: int) -> tuple[pa.RecordBatch | None, int]:
        """Cut a large slice into buffers of about bufferSize, straight from its memory; return the rest and its size."""
        rows = batch.num_rows
        per_buffer = max(1, rows * self.buffer_size // max(size, 1))
        start = 0
        while rows - start >= per_buffer:
            self._push(sub, batch.slice(start, per_buffer))
            start += per_buffer
        if start >= rows:
            return None, 0
        rest = batch.slice(start)
        return rest, rest.nbytes

    def _push_pending(self, sub: int) -> None:
        """The small slices gathered for ``sub`` leave as one buffer (only small data is concatenated)."""
        slices = self.pending[sub]
        if slices:
            self._push(sub, slices[0] if len(slices) == 1 else pa.concat_batches(slices))
            self.pending[sub] = []
            self.pending_bytes[sub] = 0

    def flush(self) -> None:
        with self._lock:
            for sub in range(self.n):
                self._push_pending(sub)

    def _flush_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
            except BaseException as exc:  # noqa: BLE001 - reported to the task thread on its next write
                self._flush_error = exc
                return

    def close(self) -> dict:
        """Flush everything and finish the partition (end-of-partition to every subpartition)."""
        self._stop_flusher()
        if self._flush_error is not None:
            raise self._flush_error
        self.flush()
        return self.writer.finish()

    def _stop_flusher(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()

    def abort(self, reason: str) -> None:
        self._stop_flusher()
        self.writer.fail(reason)
