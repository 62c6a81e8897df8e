"""The record writer: routes a task's Arrow batches to subpartitions and cuts them into buffers.

Flink's RecordWriter + ChannelSelector + the output flusher, sort-based for
many subpartitions (FLIP-148). Rows are routed with a vectorised selector as
batches arrive and the batches gather in one sort buffer of at most
``sortBufferSize`` bytes. When it is full (or its oldest row has waited
``bufferTimeout``, or at close) the whole buffer is grouped by subpartition
with one stable sort and one ``take``, then cut: a subpartition with at least
``bufferSize`` bytes leaves as whole buffers; the small ones are packed into
regions (``buffer.Region``) of at most one buffer slot, one push and one credit
per region. So the writer's memory is bounded by ``sortBufferSize`` whatever
``numSubpartitions`` is, and a flush of thousands of small subpartitions is a
few pushes.

With few subpartitions (``numSubpartitions x bufferSize <= sortBufferSize``,
Flink's hash shuffle below ``sort-shuffle.min-parallelism``) each batch is
split as it comes and slices gather per subpartition until ``bufferSize``:
the same memory bound, and measured faster there than one large gather.
``forward`` and ``broadcast`` have a single target and always work that way.
A ``broadcast`` buffer is serialised once and pushed once; the service stores
it once and every subpartition refers to it (with no numSubpartitions known,
one shared subpartition serves every reader).
"""
from __future__ import annotations

import threading
import time
from typing import Iterable

import numpy as np
import pyarrow as pa

from ..buffer import BatchEncoder, Region
from ..buffer_kinds import BROADCAST, BufferKind
from ..kinds import Partitioner, PartitionType
from .partition_writer import PartitionWriter
from .selectors import group_by_target, make_selector, split_by_target

# a timed flush of the sort buffer waits at least this many times what the last flush took: a flush costs
# about 20 us per subpartition it packs (tens of ms with thousands), and the flusher must not become the
# writer's main work
FLUSH_COST_FACTOR = 10
PIECE_SECONDS = 20e-6  # what a flush spends per subpartition it packs (measured), the guess before a first flush


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
    def __init__(self, writer: PartitionWriter, schema: pa.Schema, partitioner: Partitioner | str, num_subpartitions: int,
                 producer_index: int, *, keys: tuple[str, ...] = (), buffer_size: int = 1 << 20,
                 buffer_timeout: float = 0.1, compression: str = "none", num_producers: int | None = None,
                 custom: str | None = None, sort_buffer_size: int = 32 << 20) -> None:
        self.writer = writer
        self.schema = schema
        self.encoder = BatchEncoder(schema, compression)
        self.buffer_size = buffer_size
        partitioner = Partitioner.of(partitioner)
        self.single = partitioner.single_subpartition
        self.n = 1 if self.single else num_subpartitions
        # the subpartition index each accumulator pushes to
        self.targets = [BROADCAST if partitioner is Partitioner.BROADCAST and num_subpartitions > 1 else 0] if self.single \
            else list(range(self.n))
        self.selector = None if self.single else make_selector(
            partitioner, num_subpartitions, producer_index, schema, keys=keys, num_producers=num_producers,
            custom=custom)
        # Few targets (n x bufferSize fits the sort buffer's bytes: Flink's hash shuffle below
        # sort-shuffle.min-parallelism): each batch is split as it comes, slices gathered per subpartition
        # until bufferSize. Measured faster than sorting there (no large gather), same memory bound.
        self.sort_buffer_size = sort_buffer_size
        self.sorting = not self.single and self.n * buffer_size > sort_buffer_size
        self.pending: list[list[pa.RecordBatch]] = [] if self.sorting else [[] for _ in range(self.n)]
        self.pending_bytes = [] if self.sorting else [0] * self.n
        self.held_bytes = 0  # rows the writer holds, pending or in the sort buffer
        self.peak_held_bytes = 0  # the most it held: the writer's memory bound, checked by tests
        # many targets: the sort buffer (batches and their routed targets) and the region being packed
        self.sort_batches: list[pa.RecordBatch] = []
        self.sort_targets: list = []
        self.sort_bytes = 0
        self.sort_flushes = 0
        self._oldest = 0.0  # when the sort buffer's first batch arrived
        self._flush_cost = self.n * PIECE_SECONDS  # CPU seconds the last sort flush took
        # a BLOCKING partition is read only once finished: nothing to gain from sending its rows early
        self._timed_sort_flush = getattr(writer, "partition_type", "") != PartitionType.BLOCKING
        self.region = Region(self.encoder.schema_message, buffer_size)
        self.region_flags = 0  # FLAG_COMPRESSED once a piece of the region being packed is a compressed message
        self.rows = 0
        # data buffers and rows pushed per accumulator (a broadcast's one counts for every subpartition): sent at
        # finish so the service and every reader can tell that nothing was lost
        self.sent_buffers = np.zeros(self.n, dtype=np.int64)
        self.sent_rows = np.zeros(self.n, dtype=np.int64)
        # and their bytes as they would be uncompressed (the encoder's count of each buffer it made): exact sizes for
        # read layouts of a compressed exchange, whose buffers are compressed or not each by its own size
        self.sent_raw_bytes = np.zeros(self.n, dtype=np.int64)
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
        self.writer.check()  # a released partition fails the task now, even while its rows are only held
        if batch.num_rows == 0:
            return
        batch = conform(batch, self.schema)
        self.rows += batch.num_rows
        if not self.sorting:
            # sizes by the batch's average row: one nbytes per batch, not one per slice (~7 us each, 8 per
            # batch at 8 subpartitions: 7 % of a write task's CPU); they decide when a buffer is full and count
            # the writer's held bytes, both of which an average within one batch serves
            row_bytes = batch.nbytes / batch.num_rows
            parts = [(0, batch)] if self.single else [
                (i, p) for i, p in enumerate(split_by_target(batch, self.selector.select(batch), self.n))
                if p is not None]
            with self._lock:
                for sub, part in parts:
                    self._gather(sub, part, int(part.num_rows * row_bytes))
            return
        targets = self.selector.select(batch)
        size = batch.nbytes
        with self._lock:
            if self.sort_batches and self.sort_bytes + size > self.sort_buffer_size:
                self._flush_sorted()
            if not self.sort_batches:
                self._oldest = time.monotonic()
            self.sort_batches.append(batch)
            self.sort_targets.append(targets)
            self.sort_bytes += size
            self._held(size)
            if self.sort_bytes >= self.sort_buffer_size:
                self._flush_sorted()

    def write_all(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.write(batch)

    def _held(self, nbytes: int) -> None:
        self.held_bytes += nbytes
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    # ---------------------------------------------------------------- one or a few targets
    def _gather(self, sub: int, part: pa.RecordBatch, size: int) -> None:
        if self.pending[sub] and self.pending_bytes[sub] + size > self.buffer_size:
            self._push_pending(sub)
        if size >= self.buffer_size:
            part, size = self._push_whole_buffers(sub, part, size)
        if part is not None:
            self.pending[sub].append(part)
            self.pending_bytes[sub] += size
            self._held(size)

    def _push_pending(self, sub: int) -> None:
        """The small slices gathered for ``sub`` leave as one buffer (only small data is concatenated)."""
        slices = self.pending[sub]
        if slices:
            self._push(sub, slices[0] if len(slices) == 1 else pa.concat_batches(slices))
            self.held_bytes -= self.pending_bytes[sub]
            self.pending[sub] = []
            self.pending_bytes[sub] = 0

    def _push(self, sub: int, batch: pa.RecordBatch) -> None:
        self.writer.push_batch(self.targets[sub], batch, self.encoder)
        self._sent(sub, batch.num_rows)

    def _sent(self, sub: int, rows: int) -> None:
        """Count a buffer of ``sub`` the encoder has just made (and the writer pushed or packed)."""
        self.sent_buffers[sub] += 1
        self.sent_rows[sub] += rows
        self.sent_raw_bytes[sub] += self.encoder.plain_bytes

    def counts(self) -> dict:
        """What this writer pushed, per subpartition (compact lists; one entry for a broadcast: every one)."""
        return {"buffers": self.sent_buffers.tolist(), "rows": self.sent_rows.tolist()}

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

    # ---------------------------------------------------------------- many targets: the sort buffer
    def _flush_sorted(self) -> None:
        """Group the sort buffer by subpartition; big runs leave as whole buffers, small ones packed in regions."""
        batches, targets = self.sort_batches, self.sort_targets
        self.held_bytes -= self.sort_bytes
        self.sort_batches, self.sort_targets, self.sort_bytes = [], [], 0
        if not batches:
            return
        self.sort_flushes += 1
        started = time.thread_time()  # CPU time: waiting for credit or a core costs the writer nothing
        # one copy of the rows, then the batches go (a Spark task has dropped its own): the flush holds the
        # sort buffer's bytes twice (these rows and the grouped ones) plus the region being packed
        combined = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        del batches
        grouped, subs, starts, counts = group_by_target([combined], [np.concatenate(targets)], self.n)
        del combined, targets
        row_bytes = grouped.nbytes / max(grouped.num_rows, 1)
        big = (counts * row_bytes >= self.buffer_size).tolist()
        encode = self.encoder.encode
        region = self.region
        for sub, start, count, is_big in zip(subs.tolist(), starts.tolist(), counts.tolist(), big):
            part = grouped.slice(start, count)
            if is_big:
                part, _ = self._push_whole_buffers(sub, part, part.nbytes)
                if part is None:
                    continue
            payload = encode(part)
            if not region.fits(len(payload)):
                self._push_region()
                if not region.fits(len(payload)):  # rows wider than the average: cut by their real size
                    part, _ = self._push_whole_buffers(sub, part, part.nbytes)
                    if part is None:
                        continue
                    payload = encode(part)
                    if not region.fits(len(payload)):
                        self.writer.push_encoded(sub, payload, self.encoder.last_flags)
                        self._sent(sub, part.num_rows)
                        continue
            region.add(sub, payload)  # each piece is a buffer of its subpartition
            self.region_flags |= self.encoder.last_flags
            self._sent(sub, part.num_rows)
        self._push_region()
        self._flush_cost = time.thread_time() - started

    def _push_region(self) -> None:
        region = self.region
        if len(region) == 1:
            self.writer.push_encoded(region.subs[0], region.payloads[0], self.region_flags)
        elif len(region) > 1:
            self.writer.push_region(region, self.region_flags)
        region.clear()
        self.region_flags = 0

    def flush(self, older_than: float | None = None) -> None:
        """Send everything held; the output flusher passes ``older_than``: only a sort buffer whose first
        rows waited that long (and ten times what the last flush took) leaves."""
        with self._lock:
            if not self.sorting:
                for sub in range(self.n):
                    self._push_pending(sub)
            elif older_than is None:
                self._flush_sorted()
            elif self.sort_batches and self._timed_sort_flush and \
                    time.monotonic() - self._oldest >= max(older_than, FLUSH_COST_FACTOR * self._flush_cost):
                self._flush_sorted()

    def _flush_loop(self, interval: float) -> None:
        # Gathering per subpartition: everything leaves every interval, as before. Sorting: woken every half
        # interval, a sort buffer whose first rows waited half an interval leaves: no row waits longer than
        # bufferTimeout (unless flushes are expensive, see FLUSH_COST_FACTOR), and a buffer that fills
        # faster than that is not flushed early.
        period = interval / 2 if self.sorting else interval
        while not self._stop.wait(period):
            try:
                self.flush(older_than=period)
            except BaseException as exc:  # noqa: BLE001 - reported to the task thread on its next write
                self._flush_error = exc
                return

    def close(self, marker: bytes | None = None) -> dict:
        """Flush everything and finish the partition (end-of-partition to every subpartition); ``marker``
        goes to every subpartition between the two (a stream's epoch marker)."""
        self._stop_flusher()
        if self._flush_error is not None:
            raise self._flush_error
        self.flush()
        if marker is not None:
            self.writer.push(BROADCAST, marker, kind=BufferKind.MARKER)
        return self.writer.finish(self.counts())

    def _stop_flusher(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()

    def abort(self, reason: str) -> None:
        """Fail the partition now: a flusher waiting for credit gives up at once instead of after
        pipelined.noConsumerTimeout (it could hold the task for minutes)."""
        self.writer.abandon(reason)
        self._stop_flusher()
        self.writer.fail(reason)
