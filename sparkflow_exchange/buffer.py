"""The buffer: one Arrow IPC record-batch message, optionally compressed.

Flink's Buffer/BufferBuilder. The payload is the IPC encapsulated message
without the schema (the exchange carries the schema once), so the reader maps
it zero-copy. Compression uses Arrow's own IPC body compression (lz4 frame or
zstd per column buffer): measured faster than compressing the whole message
with the zstandard module, and decompression needs no extra step.

Every data buffer ends with an 8-byte trailer: the CRC32C of its IPC message
and the message's length, big endian (8 bytes keep the next piece of a region
8-aligned, as Arrow's zero-copy reads want). The writer adds it where it serialises; the bytes travel
untouched through every path (socket, shared-memory slot, spill file, region
piece), so only the reader, in :func:`decode`, checks and strips it.
"""
from __future__ import annotations

import base64
import functools
import struct
import warnings

import google_crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from .arrow_numpy import empty_batch  # noqa: E402
from .buffer_kinds import FLAG_COMPRESSED  # noqa: E402
from .ipc_body import (  # noqa: F401
    _ARROW_BUFFER,
    _I32,
    _I64,
    MIN_BATCH_BYTES,
    MIN_SAVING_PERCENT,
    RETRY_AFTER,
    SKIP_MIN_BYTES,
    ZSTD_LEVEL,
    compressed_buffers,
    is_compressed,
    raw_size,
)
from .ipc_body import _field as _field_at
from .ipc_body import body_buffers as _body_buffers

# after every data buffer's IPC message: its CRC32C and its length. 8 bytes, not 4: IPC messages are padded to
# 8 bytes and Arrow maps aligned buffers zero-copy, so a region's next piece must start 8-aligned too
TRAILER = struct.Struct(">II")
TRAILER_SIZE = TRAILER.size
_COPY_BELOW = 64 << 10  # smaller messages are serialised, then copied with their trailer (a stream writer costs more)


class ChecksumError(ValueError):
    """A data buffer's bytes are not the bytes its writer sent: it was corrupted on the way or at rest."""


if google_crc32c.implementation != "c":  # pragma: no cover - a platform without the wheel's C extension
    warnings.warn("google-crc32c runs its pure-Python fallback here: every data buffer's checksum will be slow "
                  "(install a build with the C extension)", RuntimeWarning, stacklevel=1)


def checksum(data) -> int:
    """CRC32C (hardware accelerated by google-crc32c) of any buffer, without copying it."""
    return google_crc32c.value(data if isinstance(data, (bytes, pa.Buffer)) else pa.py_buffer(data))


def seal(message) -> pa.Buffer:
    """An IPC message followed by its trailer (one copy: for messages built elsewhere, and small ones)."""
    return pa.py_buffer(b"".join((message, TRAILER.pack(checksum(message), len(message)))))


def verify(payload) -> pa.Buffer:
    """The IPC message of a data buffer whose trailer matches; :class:`ChecksumError` otherwise (zero copy)."""
    buf = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    n = len(buf) - TRAILER_SIZE
    if n < 0:
        raise ChecksumError(f"a data buffer of {len(buf)} bytes is too short to hold its checksum")
    message = buf.slice(0, n)
    expected, length = TRAILER.unpack_from(buf, n)
    if length != n:
        raise ChecksumError(f"a data buffer of {n} bytes says it holds {length} (truncated or misframed)")
    actual = checksum(message)
    if actual != expected:
        raise ChecksumError(f"checksum mismatch in a data buffer of {n} bytes (CRC32C {actual:#010x}, "
                            f"written as {expected:#010x})")
    return message


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


@functools.lru_cache(maxsize=64)  # a schema is immutable: each gate of a read asks for the same one (0.3 ms)
def schema_from_b64(text: str) -> pa.Schema:
    return ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


_SCHEMA_LENGTHS: dict[tuple[bytes, str | None], int | None] = {}  # per schema, not per write task (0.3 ms each)


def compression_codec(name: str) -> pa.Codec:
    """The codec both writers compress ``name`` with: zstd at the contract's level (the JVM writer's too)."""
    return pa.Codec(name, compression_level=ZSTD_LEVEL if name == "zstd" else None)


def _stream_schema_length(schema: pa.Schema, message: pa.Buffer, compression: str | None) -> int | None:
    """Bytes an IPC stream spends on its schema before the first batch; None if not just a schema.

    ``encode_into`` writes a whole stream into the destination and hands out
    what follows the schema; that needs the schema message to be all that
    precedes the batch (no dictionary batches). ``message``: ``schema.serialize()``.
    Cached by those bytes (metadata included: ``Schema ==`` ignores it, the length does not).
    """
    key = (message.to_pybytes(), compression)
    if key in _SCHEMA_LENGTHS:
        return _SCHEMA_LENGTHS[key]
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema, options=ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_batch(empty_batch(schema))
    stream = sink.getvalue()
    try:
        ipc.read_record_batch(stream.slice(len(message)), schema)
        length: int | None = len(message)
    except (pa.ArrowInvalid, OSError, ValueError):
        length = None
    if len(_SCHEMA_LENGTHS) > 64:
        _SCHEMA_LENGTHS.clear()
    _SCHEMA_LENGTHS[key] = length
    return length



def store_raw_where_larger(message: pa.Buffer, codec: str) -> pa.Buffer:
    """``message`` (a compressed IPC record batch) with each buffer that saved too little stored uncompressed.

    Arrow C++ keeps every compressed buffer, however little it shrank (pyarrow offers no ``min_space_savings``):
    random bytes would cost a decompression for nothing. The message's flatbuffer (Message -> RecordBatch ->
    buffers, bodyLength) is patched where its fields lie and the body rebuilt, 8-aligned; untouched if every buffer
    saved at least :data:`MIN_SAVING_PERCENT` (the usual case: one pass over a few numbers per column).
    """
    view = memoryview(message)
    found = _body_buffers(view)
    if found is None:
        return message
    meta, vector, body_len_at, body_start, spans = found
    raw_at = []
    for i, (offset, length) in enumerate(spans):
        if length >= 8:
            size = _I64.unpack_from(view, body_start + offset)[0]
            if size > 0 and (length - 8) * 100 > size * (100 - MIN_SAVING_PERCENT):
                raw_at.append(i)
    if not raw_at:
        return message
    decompressor = pa.Codec(codec)
    raw = set(raw_at)
    new_meta = bytearray(meta)
    parts: list = []
    position = 0
    for i, (offset, length) in enumerate(spans):
        piece = view[body_start + offset:body_start + offset + length]
        if i in raw:
            size = _I64.unpack_from(piece, 0)[0]
            piece = b"".join((_I64.pack(-1), decompressor.decompress(piece[8:], decompressed_size=size)))
        n = len(piece)
        _ARROW_BUFFER.pack_into(new_meta, vector + 4 + 16 * i, position, n)
        parts.append(piece)
        pad = -n % 8
        if pad:
            parts.append(b"\0" * pad)
        position += n + pad
    _I64.pack_into(new_meta, body_len_at, position)
    return pa.py_buffer(b"".join((view[:8], new_meta, *parts)))


class _BufferCompressor:
    """Compressed IPC messages of one schema, each Arrow buffer compressed on its own or stored as it is.

    pyarrow compresses every buffer of a message (and only then can a buffer be put back raw): on incompressible
    columns that is the whole cost. Here a buffer position (a column's validity, offsets or data) whose bytes did
    not shrink by ``MIN_SAVING_PERCENT`` is stored as it is, without trying, for the next :data:`RETRY_AFTER`
    batches (if it had at least :data:`SKIP_MIN_BYTES`: a smaller buffer's saving is mostly the codec's framing).
    The message is the batch's own uncompressed serialisation (Arrow's layout of its nodes and buffers) under the
    metadata pyarrow writes for a compressed batch of this schema (the same fields, patched in place:
    length, nodes, buffers, bodyLength). A batch none of whose buffers would be compressed (:meth:`stores_all_raw`)
    goes as that uncompressed serialisation itself: compression is per message in the IPC format. The JVM writer
    follows the same rules (``codec.StoredWhenLarger``) but one: a batch whose buffers hold fewer than
    :data:`MIN_BATCH_BYTES` together goes uncompressed here, untried (``BatchEncoder.encode`` sees most such batches
    by their size before they reach this class). pyarrow's ``Codec`` sets up a new codec context for every buffer it
    compresses and Arrow's reader one for every buffer it decompresses: for 4 KiB batches of four columns zstd then
    encodes at a tenth of its rate on 1 MiB ones; the JVM writer keeps one context.
    Schemas whose buffer count varies per batch (view types, dictionaries) use pyarrow's path (:meth:`usable`).
    """

    def __init__(self, schema: pa.Schema, codec: str, template: pa.Buffer) -> None:
        self.codec = compression_codec(codec)
        view = memoryview(template)
        meta_len = _I32.unpack_from(view, 4)[0]
        self.meta = bytes(view[8:8 + meta_len])
        found = _body_buffers(view)
        meta, self.buffers_at, self.body_len_at, _, spans = found
        root = _I32.unpack_from(meta, 0)[0]
        header = _field_at(meta, root, 2)
        batch = header + _I32.unpack_from(meta, header)[0]
        self.length_at = _field_at(meta, batch, 0)
        nodes_at = _field_at(meta, batch, 1)
        self.nodes_at = nodes_at + _I32.unpack_from(meta, nodes_at)[0]
        self.nodes = _I32.unpack_from(meta, self.nodes_at)[0]
        self.count = len(spans)
        self.skip = [0] * self.count
        self.prefix = view[:8]

    @staticmethod
    def usable(schema: pa.Schema) -> bool:
        text = str(schema)
        return "view" not in text and "dictionary" not in text

    def stores_all_raw(self, sizes: list[int]) -> bool:
        """Whether a batch of buffers of these sizes (one per position, in order) goes as an uncompressed message:
        all of them hold fewer than :data:`MIN_BATCH_BYTES` together (the skipping left as it is),
        or some of its buffers' positions are being skipped and the others (empty ones aside) hold fewer than
        :data:`SKIP_MIN_BYTES` together, too few for their saving to matter. If so, the skipped positions count the
        batch as stored as it is. The JVM writer decides the second way too (``codec.StoredWhenLarger.storesAllRaw``);
        it compresses small batches (it keeps one codec context for all its buffers)."""
        if sum(sizes) < MIN_BATCH_BYTES:
            return True
        skipped, rest = False, 0
        for i, size in enumerate(sizes):
            if size:
                if self.skip[i]:
                    skipped = True
                else:
                    rest += size
        if not skipped or rest >= SKIP_MIN_BYTES:
            return False
        for i, size in enumerate(sizes):
            if size and self.skip[i]:
                self.skip[i] -= 1
        return True

    def message(self, batch: pa.RecordBatch, plain: pa.Buffer | None = None) -> list | None:
        """The compressed message of ``batch`` as its parts, in order (``[plain]``, its uncompressed message, when
        nothing would be compressed); None if its layout is not the template's (pyarrow's path then). ``plain``:
        ``batch.serialize()`` if the caller has it already (serialised in place)."""
        if plain is None:
            plain = batch.serialize()
        view = memoryview(plain)
        found = _body_buffers(view)
        if found is None or self.length_at is None:
            return None
        meta, _, _, body_start, spans = found
        root = _I32.unpack_from(meta, 0)[0]
        header = _field_at(meta, root, 2)
        table = header + _I32.unpack_from(meta, header)[0]
        nodes_at, length_at = _field_at(meta, table, 1), _field_at(meta, table, 0)
        if nodes_at is None or length_at is None or len(spans) != self.count:
            return None
        nodes = nodes_at + _I32.unpack_from(meta, nodes_at)[0]
        if _I32.unpack_from(meta, nodes)[0] != self.nodes:
            return None
        if self.stores_all_raw([length for _offset, length in spans]):
            return [plain]  # no buffer would be compressed: the batch's own uncompressed message, no prefixes
        out = bytearray(self.meta)
        out[self.nodes_at + 4:self.nodes_at + 4 + 16 * self.nodes] = meta[nodes + 4:nodes + 4 + 16 * self.nodes]
        out[self.length_at:self.length_at + 8] = meta[length_at:length_at + 8]
        parts: list = [self.prefix, out]
        position = 0
        for i, (offset, length) in enumerate(spans):
            if length == 0:
                _ARROW_BUFFER.pack_into(out, self.buffers_at + 4 + 16 * i, position, 0)
                continue
            data = view[body_start + offset:body_start + offset + length]
            stored = None
            if self.skip[i]:
                self.skip[i] -= 1
            else:
                packed = self.codec.compress(data)
                if len(packed) * 100 <= length * (100 - MIN_SAVING_PERCENT):
                    stored = (_I64.pack(length), packed)
                elif length >= SKIP_MIN_BYTES:
                    self.skip[i] = RETRY_AFTER
            if stored is None:
                stored = (_NOT_COMPRESSED, data)
            n = 8 + len(stored[1])
            _ARROW_BUFFER.pack_into(out, self.buffers_at + 4 + 16 * i, position, n)
            parts.extend(stored)
            pad = -n % 8
            if pad:
                parts.append(_PADDING[:pad])
            position += n + pad
        _I64.pack_into(out, self.body_len_at, position)
        return parts


_NOT_COMPRESSED = _I64.pack(-1)
_PADDING = bytes(8)


class BatchEncoder:
    """Serialises record batches of one schema into buffer payloads."""

    def __init__(self, schema: pa.Schema, compression: str = "none") -> None:
        self.schema = schema
        self.compression = None if compression == "none" else compression
        self.flags = FLAG_COMPRESSED if self.compression else 0
        self._options = ipc.IpcWriteOptions(
            compression=compression_codec(self.compression) if self.compression else None)
        self.schema_message = schema.serialize()  # what an IPC stream starts with (a region does too)
        self._schema_len = _stream_schema_length(schema, self.schema_message, self.compression)
        # where an uncompressed stream's batch starts: a compressed exchange's batch with nothing to compress is one
        self._plain_schema_len = self._schema_len if self.compression is None else \
            _stream_schema_length(schema, self.schema_message, None)
        self._compressor: _BufferCompressor | None | bool = None  # made from the first non-empty batch
        # the last batch's data buffer as it would be uncompressed (its uncompressed IPC message and trailer): what
        # a writer reports per subpartition, since a compressed exchange's batches are compressed or not each on its own
        self.plain_bytes = 0
        # the last buffer's flags: FLAG_COMPRESSED only if its message is compressed (the service then reads its sizes;
        # an uncompressed message, a small batch's or one with nothing to compress, is counted at its own size)
        self.last_flags = self.flags

    def encode(self, batch: pa.RecordBatch) -> pa.Buffer:
        """The batch's data buffer: its IPC message and checksum trailer."""
        at = self._plain_schema_len
        size = ipc.get_record_batch_size(batch)  # its uncompressed message's length (batch.serialize()'s)
        self.plain_bytes = size + TRAILER_SIZE
        plain_only = self.compression is None or size < MIN_BATCH_BYTES  # small: as an uncompressed exchange's
        self.last_flags = 0
        if at is not None and size >= _COPY_BELOW and (plain_only or self._compressor):
            # serialised in place next to its trailer: no copy of a large message
            dest = pa.allocate_buffer(at + size + TRAILER_SIZE)
            if self._write_plain(batch, dest) == at + size:
                plain = dest.slice(at, size)
                parts = [plain] if plain_only else self._compressor.message(batch, plain)
                if parts is not None and len(parts) == 1 and parts[0] is plain:  # it goes uncompressed
                    TRAILER.pack_into(memoryview(dest), at + size, checksum(plain), size)
                    return dest.slice(at, size + TRAILER_SIZE)
                if parts is not None:
                    self.last_flags = self.flags
                    return self._sealed(parts)
        if plain_only:
            return seal(batch.serialize())
        message = self._message(batch)
        self.last_flags = self._flags_of(message)
        if isinstance(message, list):
            return self._sealed(message)
        return seal(message)

    def _flags_of(self, message: pa.Buffer | list) -> int:
        """The flags of a buffer of :meth:`_message`: a list of one part is a batch's uncompressed message."""
        return 0 if isinstance(message, list) and len(message) == 1 else self.flags

    def _write_plain(self, batch: pa.RecordBatch, dest: pa.Buffer) -> int | None:
        """Writes an uncompressed stream of ``batch`` (the schema message, then the batch's) into ``dest``: where the
        batch's message ends in it, or None if it does not fit."""
        sink = pa.FixedSizeBufferWriter(dest)
        try:
            ipc.new_stream(sink, self.schema).write_batch(batch)
        except (pa.ArrowInvalid, OSError):  # larger than dest
            return None
        return sink.tell()

    @staticmethod
    def _sealed(parts: list) -> pa.Buffer:
        """A message's parts and their trailer in one buffer (one copy)."""
        crc, n = 0, 0
        for part in parts:
            crc = google_crc32c.extend(crc, part if isinstance(part, (bytes, pa.Buffer)) else pa.py_buffer(part))
            n += len(part)
        parts.append(TRAILER.pack(crc, n))
        return pa.py_buffer(b"".join(parts))

    def _message(self, batch: pa.RecordBatch) -> pa.Buffer | list:
        """The batch's IPC message, or (compressed) its parts in order."""
        if self.compression is None:
            return batch.serialize()
        if self._compressor is None and batch.num_rows:
            self._compressor = _BufferCompressor(self.schema, self.compression, self._pyarrow_message(
                batch.slice(0, 1), raw_where_larger=False)) if _BufferCompressor.usable(self.schema) else False
        if self._compressor:
            parts = self._compressor.message(batch)
            if parts is not None:
                return parts
        return self._pyarrow_message(batch)

    def _pyarrow_message(self, batch: pa.RecordBatch, raw_where_larger: bool = True) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, self.schema, options=self._options) as writer:
            start = None
            writer.write_batch(batch.slice(0, 0))  # forces the schema message out first
            start = sink.tell()
            writer.write_batch(batch)
            end = sink.tell()
        message = sink.getvalue().slice(start, end - start)
        return store_raw_where_larger(message, self.compression) if raw_where_larger else message

    def encode_into(self, batch: pa.RecordBatch, dest: memoryview) -> tuple[int, int] | None:
        """Serialise ``batch`` straight into ``dest`` (a shared-memory slot): (offset, length), or None if it won't fit."""
        size = ipc.get_record_batch_size(batch)
        self.plain_bytes = size + TRAILER_SIZE
        if self.compression is None or (size < MIN_BATCH_BYTES and self._plain_schema_len is not None):
            at = self._plain_schema_len  # a small batch of a compressed exchange too: its uncompressed message
            if at is None or size + at + TRAILER_SIZE > len(dest):
                return None
            end = self._write_plain(batch, pa.py_buffer(dest))
            self.last_flags = 0
        elif self._schema_len is None:
            return None
        else:  # serialised apart (buffer by buffer), then placed after the schema
            at = self._schema_len
            message = self._message(batch)
            self.last_flags = self._flags_of(message)
            parts = message if isinstance(message, list) else [message]
            end = at + sum(len(p) for p in parts)
            if end + TRAILER_SIZE <= len(dest):
                position = at
                for part in parts:
                    dest[position:position + len(part)] = memoryview(part).cast("B")
                    position += len(part)
        if end is None or end + TRAILER_SIZE > len(dest):
            return None
        n = end - at
        TRAILER.pack_into(dest, end, checksum(dest[at:end]), n)
        return at, n + TRAILER_SIZE


class Region:
    """Small buffers of several subpartitions packed into one payload: FLIP-148's region.

    A region is the schema message, then one data buffer per piece (piece =
    one buffer of one subpartition: its IPC message and checksum trailer, as
    :meth:`BatchEncoder.encode` makes it, readable on its own by :func:`decode`). It costs the writer one credit and
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
    """A data buffer's batch once its checksum matches (:class:`ChecksumError` if not).

    Zero-copy for uncompressed payloads; Arrow decompresses compressed bodies itself."""
    return ipc.read_record_batch(verify(payload), schema)
