"""The buffer: one Arrow IPC record-batch message, optionally compressed.

Flink's Buffer/BufferBuilder. The payload is the IPC encapsulated message
without the schema (the exchange carries the schema once), so the reader maps
it zero-copy. Compression uses Arrow's own IPC body compression (lz4 frame or
zstd per column buffer): measured faster than compressing the whole message
with the zstandard module, and decompression needs no extra step.
"""
from __future__ import annotations

import base64

import pyarrow as pa
import pyarrow.ipc as ipc

from .network.protocol import FLAG_COMPRESSED


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class BatchEncoder:
    """Serialises record batches of one schema into buffer payloads."""

    def __init__(self, schema: pa.Schema, compression: str = "none") -> None:
        self.schema = schema
        self.compression = None if compression == "none" else compression
        self.flags = FLAG_COMPRESSED if self.compression else 0
        self._options = ipc.IpcWriteOptions(compression=self.compression)
        self._schema_len = self._stream_schema_length()
        self.schema_message = self.schema.serialize()  # what an IPC stream starts with (a region does too)

    def _stream_schema_length(self) -> int | None:
        """Bytes an IPC stream spends on its schema before the first batch; None if not just a schema.

        ``encode_into`` writes a whole stream into the destination and hands out
        what follows the schema; that needs the schema message to be all that
        precedes the batch (no dictionary batches).
        """
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self.schema, options=self._options) as writer:
            empty = pa.RecordBatch.from_pylist([], schema=self.schema)
            writer.write_batch(empty)
        stream = sink.getvalue()
        schema_len = len(self.schema.serialize())
        try:
            ipc.read_record_batch(stream.slice(schema_len), self.schema)
        except (pa.ArrowInvalid, OSError, ValueError):
            return None
        return schema_len

    def encode(self, batch: pa.RecordBatch) -> pa.Buffer:
        if self.compression is None:
            return batch.serialize()
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self.schema, options=self._options) as writer:
            start = None
            writer.write_batch(batch.slice(0, 0))  # forces the schema message out first
            start = sink.tell()
            writer.write_batch(batch)
            end = sink.tell()
        return sink.getvalue().slice(start, end - start)

    def encode_into(self, batch: pa.RecordBatch, dest: memoryview) -> tuple[int, int] | None:
        """Serialise ``batch`` straight into ``dest`` (a shared-memory slot): (offset, length), or None if it won't fit."""
        if self._schema_len is None:
            return None
        if self.compression is None and ipc.get_record_batch_size(batch) + self._schema_len > len(dest):
            return None
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(dest))
        try:
            ipc.new_stream(sink, self.schema, options=self._options).write_batch(batch)
        except (pa.ArrowInvalid, OSError):  # compressed data that did not shrink enough
            return None
        return self._schema_len, sink.tell() - self._schema_len


class Region:
    """Small buffers of several subpartitions packed into one payload: FLIP-148's region.

    A region is one Arrow IPC stream: the schema message, then one
    record-batch message per piece (piece = one buffer of one subpartition,
    readable on its own by :func:`decode`). It costs the writer one credit and
    one pool slot, so a flush of thousands of small subpartitions is a few
    pushes instead of thousands. ``capacity`` bounds the whole payload.
    """

    def __init__(self, schema_message: pa.Buffer, capacity: int) -> None:
        self.schema_message = schema_message
        self.capacity = capacity
        self.clear()

    def __len__(self) -> int:
        return len(self.subs)

    def fits(self, nbytes: int) -> bool:
        return self.nbytes + nbytes <= self.capacity

    def add(self, subpartition: int, payload: pa.Buffer) -> None:
        n = len(payload)
        if self.nbytes + n > self.capacity:
            raise ValueError(f"a piece of {n} bytes does not fit the region ({self.nbytes} of "
                             f"{self.capacity} bytes used)")
        self.subs.append(subpartition)
        self.parts.append(payload)
        self._pieces.append((subpartition, self.nbytes, n))
        self.nbytes += n

    @property
    def payloads(self) -> list[pa.Buffer]:
        return self.parts[1:]

    def pieces(self) -> tuple[tuple[int, int, int], ...]:
        """(subpartition, offset, length) of every piece, offsets from the region's start."""
        return tuple(self._pieces)

    def payload(self) -> bytes:
        return b"".join(self.parts)  # one pass in C over the buffers

    def write_into(self, dest: memoryview) -> int:
        """Copy the region into ``dest`` (a shared-memory slot); the bytes written."""
        if self.nbytes > len(dest):
            raise ValueError(f"a region of {self.nbytes} bytes does not fit {len(dest)} bytes")
        offset = 0
        for part in self.parts:  # straight into the slot: no intermediate buffer to allocate and fault in
            n = len(part)
            dest[offset:offset + n] = memoryview(part).cast("B")
            offset += n
        return offset

    def clear(self) -> None:
        self.subs: list[int] = []
        self.parts: list = [self.schema_message]
        self._pieces: list[tuple[int, int, int]] = []
        self.nbytes = len(self.schema_message)


def decode(payload: bytes | memoryview | pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    """Zero-copy for uncompressed payloads; Arrow decompresses compressed bodies itself."""
    buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    return ipc.read_record_batch(buf, schema)
