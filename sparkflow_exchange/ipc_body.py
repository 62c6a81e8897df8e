"""The layout of a compressed Arrow IPC record-batch message, read without pyarrow (the service counts sizes).

A message is the continuation marker (-1), the flatbuffer's length, the flatbuffer (Message -> RecordBatch ->
buffers: (offset, length) of each body buffer; compression; bodyLength) and the body. With body compression each
buffer starts with its uncompressed length (little-endian i64), -1 when the bytes that follow are stored as they
are. Compression is per message: a compressed exchange's writer sends a record batch whose every buffer would be
stored as it is as an uncompressed message (no compression field, no prefixes), so its stream mixes both kinds.
"""
from __future__ import annotations

import struct

from . import contract

# a compressed Arrow buffer is kept only if it saves this share of its bytes; else it is stored as it is (the IPC
# format's per-buffer "uncompressed" length, -1), as the JVM writer does: reading it costs no decompression
MIN_SAVING_PERCENT = contract.load()["compression"]["min_saving_percent"]
# a buffer position (one column's validity, offsets or data) that saved less is then stored as it is, untried, for a
# writer's next RETRY_AFTER record batches: incompressible columns cost one attempt in RETRY_AFTER + 1 (both writers)
RETRY_AFTER = contract.load()["compression"]["retry_after"]
# only a buffer of at least this many bytes starts that skipping: a smaller one's saving is mostly the codec's framing
SKIP_MIN_BYTES = contract.load()["compression"]["skip_min_bytes"]
# the Python writer sends a record batch whose buffers hold fewer bytes than this together as an uncompressed message,
# untried: pyarrow sets up a codec context per buffer, which below it costs more than the compression is worth
MIN_BATCH_BYTES = contract.load()["compression"]["min_batch_bytes"]
# zstd's level in both writers (the JVM's Codecs.ZSTD_LEVEL is generated from the same field)
ZSTD_LEVEL = contract.load()["compression"]["zstd_level"]
_I32, _U16, _I64 = struct.Struct("<i"), struct.Struct("<H"), struct.Struct("<q")
_ARROW_BUFFER = struct.Struct("<qq")  # flatbuffers' Buffer struct: offset, length in the body
_TRAILER_SIZE = contract.load()["buffer"]["trailer_size"]


def _field(meta, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies in ``meta``; None if absent."""
    vtable = table - _I32.unpack_from(meta, table)[0]
    slot = 4 + 2 * index
    if slot >= _U16.unpack_from(meta, vtable)[0]:
        return None
    offset = _U16.unpack_from(meta, vtable + slot)[0]
    return table + offset if offset else None


def _record_batch(view: memoryview) -> tuple[memoryview, int, int] | None:
    """An IPC record-batch message's flatbuffer, where its RecordBatch table and bodyLength lie; None if it is no
    such message."""
    if len(view) < 8 or _I32.unpack_from(view, 0)[0] != -1:
        return None
    meta_len = _I32.unpack_from(view, 4)[0]
    meta = view[8:8 + meta_len]
    root = _I32.unpack_from(meta, 0)[0]
    header_at, body_len_at = _field(meta, root, 2), _field(meta, root, 3)
    if header_at is None or body_len_at is None:
        return None
    return meta, header_at + _I32.unpack_from(meta, header_at)[0], body_len_at


def body_buffers(view: memoryview) -> tuple[memoryview, int, int, int, list[tuple[int, int]]] | None:
    """An IPC record-batch message's flatbuffer, where its buffers vector and bodyLength lie, the body's start and
    the buffers' (offset, length) in the body; None if it is no such message."""
    found = _record_batch(view)
    if found is None:
        return None
    meta, batch, body_len_at = found
    buffers_at = _field(meta, batch, 2)
    if buffers_at is None:
        return None
    vector = buffers_at + _I32.unpack_from(meta, buffers_at)[0]
    count = _I32.unpack_from(meta, vector)[0]
    spans = [_ARROW_BUFFER.unpack_from(meta, vector + 4 + 16 * i) for i in range(count)]
    return meta, vector, body_len_at, 8 + len(meta), spans


def is_compressed(message) -> bool:
    """Whether an IPC record-batch message's body is compressed (its RecordBatch has a compression field): a
    compressed exchange holds uncompressed messages too, for batches with nothing that shrinks."""
    view = memoryview(message).cast("B")
    found = _record_batch(view)
    if found is None:
        raise ValueError("not an Arrow IPC record-batch message")
    meta, batch, _ = found
    return _field(meta, batch, 3) is not None


def compressed_buffers(message) -> list[tuple[int, int]]:
    """(stored bytes, uncompressed bytes or -1 if stored as it is) of each body buffer of an IPC record-batch
    message (a compressed message's 8-byte length prefix included in the stored bytes; empty buffers left out).
    Every buffer of an uncompressed message is stored as it is: (its bytes, -1)."""
    view = memoryview(message).cast("B")
    found = body_buffers(view)
    if found is None:
        raise ValueError("not an Arrow IPC record-batch message")
    body_start, spans = found[3], found[4]
    if not is_compressed(view):
        return [(length, -1) for _offset, length in spans if length]
    return [(length, _I64.unpack_from(view, body_start + offset)[0]) for offset, length in spans if length >= 8]


def raw_size(payload) -> int:
    """The bytes a compressed data buffer (IPC message and trailer) would take uncompressed: its message with every
    body buffer at its uncompressed length, 8-aligned; its own size if it is no compressed record batch or cannot
    be parsed (what counts sizes must never fail a write)."""
    view = memoryview(payload).cast("B")
    try:
        batch = _record_batch(view)
        # an uncompressed message (a compressed exchange's small batches are: the usual case at wide layouts) is its
        # own size, known before its buffers are read
        if batch is None or _field(batch[0], batch[1], 3) is None:
            return len(view)
        found = body_buffers(view)
        if found is None:
            return len(view)
        body_start, spans = found[3], found[4]
        body = 0
        for offset, length in spans:
            size = _I64.unpack_from(view, body_start + offset)[0] if length >= 8 else -1
            n = size if size >= 0 else max(length - 8, 0)
            body += n + (-n % 8)
        return body_start + body + _TRAILER_SIZE
    except (struct.error, IndexError, ValueError):
        return len(view)
