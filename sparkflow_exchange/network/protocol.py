"""The wire protocol, sans-IO: messages, a frame encoder and an incremental decoder.

Nothing here touches a socket (as in h11): the asyncio server, the client's IO
thread and the producer's blocking socket all feed bytes to a
:class:`FrameDecoder` and write what :func:`encode` returns.

Frame layout (big endian)::

    length:u32 | magic:u32 | version:u8 | type:u8 | header_len:u32 | header | payload

``length`` counts every byte after itself. Data messages (buffers, credit)
carry a fixed binary header; control messages carry a small JSON header.
"""
from __future__ import annotations

import enum
import json
import re
import struct
import threading
import types
import typing
from dataclasses import dataclass, field
from typing import Any

MAGIC = 0x53465845  # "SFXE"
VERSION = 2  # 2: handshake proofs cover both nonces and the service id (network/auth.py)
PREFIX = struct.Struct(">IIBBI")  # length, magic, version, type, header_len
PREFIX_SIZE = PREFIX.size
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
PREAUTH_MAX_FRAME = 4096  # what a peer may send before it authenticated (a Hello is a few hundred bytes)
MAX_JSON_DEPTH = 64  # arrays and objects inside one another in a JSON header (ours nest a few levels)


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; the connection must close."""


class MsgType(enum.IntEnum):
    SERVER_HELLO = 1
    HELLO = 2
    WELCOME = 3
    PARTITION_REQUEST = 10
    ADD_CREDIT = 11
    RESUME_CONSUMPTION = 12
    CANCEL_PARTITION_REQUEST = 13
    CLOSE_REQUEST = 14
    BUFFER_RESPONSE = 15
    ERROR_RESPONSE = 16
    REGISTER_PARTITION = 20
    PARTITION_REGISTERED = 21
    PUSH_BUFFER = 22
    PRODUCER_CREDIT = 23
    FINISH_PARTITION = 24
    FAIL_PARTITION = 25
    PARTITION_FINISHED = 26
    PUSH_SHARED_BUFFER = 27
    SLOTS_FREED = 28
    SHARED_BUFFERS_READ = 29
    PUSH_REGION = 33
    PUSH_SHARED_REGION = 34
    PARTITION_RELEASED = 35
    RPC_REQUEST = 30
    RPC_RESPONSE = 31
    NOTIFY = 32


from ..errors import ErrorCode  # noqa: E402

_BUFFER_RESPONSE = struct.Struct(">qqiBB")  # receiver, seq, backlog, kind, flags
_ADD_CREDIT = struct.Struct(">qi")  # receiver, credit
_PUSH_BUFFER = struct.Struct(">qiBB")  # handle, subpartition, kind, flags
_PRODUCER_CREDIT = struct.Struct(">qi")  # handle, credit
_PUSH_SHARED = struct.Struct(">qiBBiII")  # handle, subpartition, kind, flags, slot, offset, length
_SLOTS_FREED = struct.Struct(">qI")  # handle, count; then count x i32 slot numbers
_SHARED_READ = struct.Struct(">qi")  # receiver, count
_SHARED_REF = struct.Struct(">QI")  # offset in the arena file, length; then the file's path (utf-8)
_PUSH_REGION = struct.Struct(">qBBI")  # handle, kind, flags, piece count; then count x _PIECE
_PUSH_SHARED_REGION = struct.Struct(">qBBiI")  # handle, kind, flags, slot, piece count; then count x _PIECE
_PIECE = struct.Struct(">iII")  # subpartition, offset, length


# ---------------------------------------------------------------- messages
@dataclass(frozen=True)
class ServerHello:
    nonce: str
    service_id: str = ""
    host_id: str = ""


@dataclass(frozen=True)
class Hello:
    client_id: str
    proof: str  # auth.prove(secret, server nonce, client nonce, service id), "" when no secret is known
    host_id: str = ""
    nonce: str = ""  # the client's challenge: the service proves the secret in its Welcome


@dataclass(frozen=True)
class Welcome:
    service_id: str
    host_id: str
    proof: str = ""  # auth.prove_service(secret, client nonce, server nonce, service id)


@dataclass(frozen=True)
class PartitionRequest:
    partition: str
    subpartition: int
    receiver_id: int
    initial_credit: int
    resume_from: int = 0
    shared: bool = False  # a reader on the service's host: send buffers in shared memory by reference
    subpartition_end: int | None = None  # read subpartitions [subpartition, end) of a finished partition as one
    # a reader going on where an earlier read of this partition (this producer attempt) stopped: the view starts at
    # buffer ``resume_at``, which must exist (or, while the partition is written, be the next one it appends);
    # anything else is refused (bad_request), never waited for. None: not a resume (``resume_from`` applies)
    resume_at: int | None = None


@dataclass(frozen=True)
class AddCredit:
    receiver_id: int
    credit: int


@dataclass(frozen=True)
class ResumeConsumption:
    receiver_id: int


@dataclass(frozen=True)
class CancelPartitionRequest:
    receiver_id: int


@dataclass(frozen=True)
class CloseRequest:
    pass


@dataclass(frozen=True)
class BufferResponse:
    receiver_id: int
    seq: int
    backlog: int
    kind: int
    flags: int
    payload: bytes | memoryview = b""


@dataclass(frozen=True)
class ErrorResponse:
    message: str
    receiver_id: int | None = None
    fatal: bool = False
    code: str = "error"


@dataclass(frozen=True)
class RegisterPartition:
    partition: str
    num_subpartitions: int
    partition_type: str
    exchange: str = ""
    attempt: str = ""
    buffer_size: int = 0  # the writer's bufferSize; 0 = the service's
    buffers: int = 0  # the writer's buffersPerPartition (pool slots); 0 = the service's
    shm_path: str = ""  # the writer's shared-memory arena (same host only); "" = push over the socket
    shm_slots: int = 0
    shm_slot_size: int = 0


@dataclass(frozen=True)
class PartitionRegistered:
    partition: str
    handle: int
    credit: int
    buffer_size: int
    shm_slots: int = 0  # arena slots the service mapped; 0 = it did not, push over the socket


@dataclass(frozen=True)
class PushBuffer:
    handle: int
    subpartition: int
    kind: int
    flags: int
    payload: bytes | memoryview = b""


@dataclass(frozen=True)
class PushSharedBuffer:
    """A buffer the writer put at ``offset`` in slot ``slot`` of its arena; needs credit like PushBuffer."""

    handle: int
    subpartition: int
    kind: int
    flags: int
    slot: int
    offset: int
    length: int


Piece = tuple[int, int, int]  # (subpartition, offset, length) of one buffer inside a region


@dataclass(frozen=True)
class PushRegion:
    """Several buffers in one frame: piece i is buffer ``payload[offset:offset+length]`` of its subpartition.

    FLIP-148's sort-based region: a writer with many subpartitions groups a
    sort buffer's rows by subpartition and pushes the small buffers together,
    one frame and one credit (one pool slot) for all of them.
    """

    handle: int
    kind: int
    flags: int
    pieces: tuple[Piece, ...]
    payload: bytes | memoryview = b""


@dataclass(frozen=True)
class PushSharedRegion:
    """A region the writer put in arena slot ``slot``; piece offsets are relative to the slot's start."""

    handle: int
    kind: int
    flags: int
    slot: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class SlotsFreed:
    """The service no longer reads these arena slots; the writer may fill them again."""

    handle: int
    slots: tuple[int, ...]


@dataclass(frozen=True)
class SharedBuffersRead:
    """The reader has copied this many more shared buffers out of their slots (oldest first)."""

    receiver_id: int
    count: int


@dataclass(frozen=True)
class SharedRef:
    """Where a shared buffer is: ``length`` bytes at ``offset`` of the arena file at ``path``."""

    path: str
    offset: int
    length: int

    def pack(self) -> bytes:
        return _SHARED_REF.pack(self.offset, self.length) + self.path.encode()

    @classmethod
    def unpack(cls, payload: bytes | memoryview) -> "SharedRef":
        if len(payload) <= _SHARED_REF.size:
            raise ProtocolError(f"shared buffer reference of {len(payload)} bytes is too short")
        offset, length = _SHARED_REF.unpack_from(payload)
        try:
            path = bytes(payload[_SHARED_REF.size:]).decode()
        except UnicodeDecodeError:
            raise ProtocolError("shared buffer reference names no readable path") from None
        return cls(path, offset, length)


@dataclass(frozen=True)
class ProducerCredit:
    handle: int
    credit: int


@dataclass(frozen=True)
class FinishPartition:
    handle: int
    # what the writer pushed: {"buffers": [...], "rows": [...]} per subpartition (one entry: every subpartition,
    # a broadcast); the service checks the buffers against what it stored and hands both to the readers
    counts: dict | None = None


@dataclass(frozen=True)
class FailPartition:
    handle: int
    reason: str


@dataclass(frozen=True)
class PartitionReleased:
    """Service to writer: the partition it is writing was released (dropped, overwritten, its attempt lost the
    commit, its write aborted...); ``code`` is ``replaced`` for a drop, overwrite or expiry, else ``released``."""

    handle: int
    message: str
    code: str = ErrorCode.RELEASED


@dataclass(frozen=True)
class PartitionFinished:
    handle: int
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RpcRequest:
    call_id: int
    method: str
    args: dict


@dataclass(frozen=True)
class RpcResponse:
    call_id: int
    result: Any = None
    error: str | None = None
    code: str = ""


@dataclass(frozen=True)
class Notify:
    topic: str
    body: dict


_JSON_TYPES: dict[MsgType, type] = {
    MsgType.SERVER_HELLO: ServerHello,
    MsgType.HELLO: Hello,
    MsgType.WELCOME: Welcome,
    MsgType.PARTITION_REQUEST: PartitionRequest,
    MsgType.RESUME_CONSUMPTION: ResumeConsumption,
    MsgType.CANCEL_PARTITION_REQUEST: CancelPartitionRequest,
    MsgType.CLOSE_REQUEST: CloseRequest,
    MsgType.ERROR_RESPONSE: ErrorResponse,
    MsgType.REGISTER_PARTITION: RegisterPartition,
    MsgType.PARTITION_REGISTERED: PartitionRegistered,
    MsgType.FINISH_PARTITION: FinishPartition,
    MsgType.FAIL_PARTITION: FailPartition,
    MsgType.PARTITION_FINISHED: PartitionFinished,
    MsgType.PARTITION_RELEASED: PartitionReleased,
    MsgType.RPC_REQUEST: RpcRequest,
    MsgType.RPC_RESPONSE: RpcResponse,
    MsgType.NOTIFY: Notify,
}
_TYPE_OF = {cls: t for t, cls in _JSON_TYPES.items()}
_TYPE_OF.update(
    {
        BufferResponse: MsgType.BUFFER_RESPONSE,
        AddCredit: MsgType.ADD_CREDIT,
        PushBuffer: MsgType.PUSH_BUFFER,
        ProducerCredit: MsgType.PRODUCER_CREDIT,
        PushSharedBuffer: MsgType.PUSH_SHARED_BUFFER,
        SlotsFreed: MsgType.SLOTS_FREED,
        SharedBuffersRead: MsgType.SHARED_BUFFERS_READ,
        PushRegion: MsgType.PUSH_REGION,
        PushSharedRegion: MsgType.PUSH_SHARED_REGION,
    }
)

Message = Any  # one of the dataclasses above


# ---------------------------------------------------------------- encoding
def _frame(mtype: int, header: bytes, payload_len: int) -> bytes:
    length = PREFIX_SIZE - 4 + len(header) + payload_len
    return PREFIX.pack(length, MAGIC, VERSION, mtype, len(header)) + header


def encode(msg: Message) -> list[bytes | memoryview]:
    """Frame a message; returns pieces to write in order (payloads are not copied)."""
    if isinstance(msg, BufferResponse):
        header = _BUFFER_RESPONSE.pack(msg.receiver_id, msg.seq, msg.backlog, msg.kind, msg.flags)
        return [_frame(MsgType.BUFFER_RESPONSE, header, len(msg.payload)), msg.payload]
    if isinstance(msg, PushBuffer):
        header = _PUSH_BUFFER.pack(msg.handle, msg.subpartition, msg.kind, msg.flags)
        return [_frame(MsgType.PUSH_BUFFER, header, len(msg.payload)), msg.payload]
    if isinstance(msg, AddCredit):
        return [_frame(MsgType.ADD_CREDIT, _ADD_CREDIT.pack(msg.receiver_id, msg.credit), 0)]
    if isinstance(msg, ProducerCredit):
        return [_frame(MsgType.PRODUCER_CREDIT, _PRODUCER_CREDIT.pack(msg.handle, msg.credit), 0)]
    if isinstance(msg, PushSharedBuffer):
        header = _PUSH_SHARED.pack(msg.handle, msg.subpartition, msg.kind, msg.flags, msg.slot, msg.offset, msg.length)
        return [_frame(MsgType.PUSH_SHARED_BUFFER, header, 0)]
    if isinstance(msg, PushRegion):
        header = _PUSH_REGION.pack(msg.handle, msg.kind, msg.flags, len(msg.pieces)) + _pack_pieces(msg.pieces)
        return [_frame(MsgType.PUSH_REGION, header, len(msg.payload)), msg.payload]
    if isinstance(msg, PushSharedRegion):
        header = _PUSH_SHARED_REGION.pack(msg.handle, msg.kind, msg.flags, msg.slot, len(msg.pieces)) \
            + _pack_pieces(msg.pieces)
        return [_frame(MsgType.PUSH_SHARED_REGION, header, 0)]
    if isinstance(msg, SharedBuffersRead):
        return [_frame(MsgType.SHARED_BUFFERS_READ, _SHARED_READ.pack(msg.receiver_id, msg.count), 0)]
    if isinstance(msg, SlotsFreed):
        header = _SLOTS_FREED.pack(msg.handle, len(msg.slots)) + struct.pack(f">{len(msg.slots)}i", *msg.slots)
        return [_frame(MsgType.SLOTS_FREED, header, 0)]
    mtype = _TYPE_OF.get(type(msg))
    if mtype is None:
        raise TypeError(f"not a protocol message: {msg!r}")
    header = json.dumps(msg.__dict__, separators=(",", ":")).encode()
    return [_frame(mtype, header, 0)]


def _pack_pieces(pieces: tuple[Piece, ...]) -> bytes:
    return b"".join(_PIECE.pack(*piece) for piece in pieces)


def _unpack_pieces(kind: MsgType, header: bytes, start: int, count: int, bound: int | None) -> tuple[Piece, ...]:
    """Pieces of a region: each inside ``bound`` bytes (the payload) when known, at least one."""
    if count < 1 or len(header) != start + _PIECE.size * count:
        raise ProtocolError(f"malformed {kind.name} frame: {count} pieces announced, {len(header) - start} bytes of them")
    pieces = tuple(_PIECE.iter_unpack(memoryview(header)[start:]))
    if bound is not None:
        for _sub, offset, length in pieces:
            if offset + length > bound:
                raise ProtocolError(f"malformed {kind.name} frame: piece of {length} bytes at {offset} "
                                    f"lies outside the region's {bound} bytes")
    return pieces


def encode_bytes(msg: Message) -> bytes:
    return b"".join(bytes(p) if isinstance(p, memoryview) else p for p in encode(msg))


# ---------------------------------------------------------------- decoding
_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def _check_field_types(kind: MsgType, cls: type, fields: dict) -> None:
    """A peer's JSON must not smuggle a string where an int belongs (it would fail far from here)."""
    hints = _FIELD_TYPES.get(cls)
    if hints is None:
        hints = _FIELD_TYPES[cls] = typing.get_type_hints(cls)
    for name, value in fields.items():
        hint = hints.get(name)
        if hint is None or hint is Any:
            continue  # unknown names are refused by the constructor
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        allowed = tuple(type(None) if a is None else typing.get_origin(a) or a for a in allowed)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ProtocolError(f"malformed {kind.name} frame: field {name!r} is {type(value).__name__}, not {hint}")


def _decode(mtype: int, header: bytes, payload: memoryview) -> Message:
    try:
        kind = MsgType(mtype)
    except ValueError:
        raise ProtocolError(f"unknown message type {mtype}") from None
    try:
        if kind is MsgType.BUFFER_RESPONSE:
            rid, seq, backlog, bkind, flags = _BUFFER_RESPONSE.unpack(header)
            return BufferResponse(rid, seq, backlog, bkind, flags, payload)
        if kind is MsgType.PUSH_BUFFER:
            handle, sub, bkind, flags = _PUSH_BUFFER.unpack(header)
            return PushBuffer(handle, sub, bkind, flags, payload)
        if kind is MsgType.ADD_CREDIT:
            return AddCredit(*_ADD_CREDIT.unpack(header))
        if kind is MsgType.PRODUCER_CREDIT:
            return ProducerCredit(*_PRODUCER_CREDIT.unpack(header))
        if kind is MsgType.PUSH_SHARED_BUFFER:
            return PushSharedBuffer(*_PUSH_SHARED.unpack(header))
        if kind is MsgType.SHARED_BUFFERS_READ:
            return SharedBuffersRead(*_SHARED_READ.unpack(header))
        if kind is MsgType.PUSH_REGION:
            handle, bkind, flags, count = _PUSH_REGION.unpack_from(header)
            pieces = _unpack_pieces(kind, header, _PUSH_REGION.size, count, len(payload))
            return PushRegion(handle, bkind, flags, pieces, payload)
        if kind is MsgType.PUSH_SHARED_REGION:
            handle, bkind, flags, slot, count = _PUSH_SHARED_REGION.unpack_from(header)
            return PushSharedRegion(handle, bkind, flags, slot, _unpack_pieces(kind, header, _PUSH_SHARED_REGION.size,
                                                                               count, None))
        if kind is MsgType.SLOTS_FREED:
            handle, count = _SLOTS_FREED.unpack_from(header)
            if len(header) != _SLOTS_FREED.size + 4 * count:
                raise ProtocolError(f"malformed SLOTS_FREED frame: {count} slots announced, {len(header)} header bytes")
            return SlotsFreed(handle, struct.unpack_from(f">{count}i", header, _SLOTS_FREED.size))
        if json_nests_deeper(header, MAX_JSON_DEPTH):  # before json.loads, which would recurse that deep
            raise ProtocolError(f"malformed {kind.name} frame: its JSON header nests deeper than {MAX_JSON_DEPTH} "
                                "levels")
        fields = json.loads(header) if header else {}
        if not isinstance(fields, dict):
            raise ProtocolError(f"{kind.name} header is not an object")
        cls = _JSON_TYPES[kind]
        _check_field_types(kind, cls, fields)
        return cls(**fields)
    except ProtocolError:
        raise
    except (struct.error, ValueError, TypeError, RecursionError) as exc:
        raise ProtocolError(f"malformed {kind.name} frame: {exc}") from None


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_BRACKETS_OR_QUOTES = bytes(b for b in range(256) if b not in b'[]{}"')
_SQUARE = bytes.maketrans(b"{}", b"[]")


def json_nests_deeper(text: bytes, limit: int) -> bool:
    """Whether the JSON ``text`` opens more than ``limit`` arrays or objects inside one another.

    Cheap, before parsing, in C: a text with at most ``limit`` brackets cannot (two ``count`` calls); else
    only its brackets outside strings are kept and each round removes the innermost pairs (``[]``): the
    rounds until none is left are the depth (a few for our messages, at most ``limit + 1``). Strings are
    cut out by a regular expression only when one may hold a bracket: without a backslash, strings free of
    brackets are the quotes left side by side once all but brackets and quotes are gone."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    brackets = text.translate(_SQUARE, _NOT_BRACKETS_OR_QUOTES).replace(b'""', b"")
    if b'"' in brackets or b"\\" in text:  # a string may hold brackets (or an escaped quote)
        brackets = _JSON_STRING.sub(b"", text).translate(_SQUARE, _NOT_BRACKETS)
    for depth in range(limit + 1):  # ``depth`` rounds done: every pair nested that deep is gone
        if not brackets:
            return False
        inner_removed = brackets.replace(b"[]", b"")
        if len(inner_removed) == len(brackets):  # unbalanced: each opening left adds a level at most
            return depth + brackets.count(b"[") > limit
        brackets = inner_removed
    return True


class _FramePool:
    """Receive buffers for large frames, reused once nothing reads them any more.

    A fresh 1 MiB ``bytearray`` per frame costs a page fault per 4 KiB page
    (malloc serves such sizes with mmap): more than the copy out of the kernel.
    Frames are received into pooled buffers instead. A buffer is handed out as
    a ``memoryview`` (an export of the bytearray, created under the lock), and
    everything that reads it - decoded messages, Arrow buffers, a transport -
    holds views derived from that export. A buffer is taken again only when it
    has no export left, which a bytearray shows by allowing a resize (the
    documented rule: a bytearray with exported views cannot be resized), not by
    reference counts, whose values differ between interpreters. One pool per
    process, bounded in bytes; beyond that, buffers are allocated and freed as before.
    """

    GRAIN = 256 * 1024

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buffers: list[bytearray] = []
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _exported(buf: bytearray) -> bool:
        try:
            buf.append(0)
        except BufferError:
            return True
        del buf[-1]
        return False

    def take(self, size: int) -> memoryview:
        """A view of at least ``size`` bytes; its buffer stays taken while this view or one made from it lives."""
        capacity = -(-size // self.GRAIN) * self.GRAIN
        with self._lock:
            for buf in self._buffers:
                if size <= len(buf) <= 2 * capacity and not self._exported(buf):
                    return memoryview(buf)
            buf = bytearray(capacity)
            if self._bytes + capacity <= self.max_bytes:
                self._buffers.append(buf)
                self._bytes += capacity
            return memoryview(buf)


FRAME_POOL = _FramePool(32 * 1024 * 1024)


class FrameDecoder:
    """Incremental decoder: give it bytes, take complete messages.

    Two ways in: ``feed(data)`` for a blocking socket, or ``get_buffer`` /
    ``buffer_updated`` for asyncio's BufferedProtocol, where the kernel writes
    straight into the decoder's memory. Small frames gather in a staging
    area; a large frame gets a buffer of its own size as soon as its prefix is
    known, so its payload is received in place and never copied again. The
    prefix is validated as soon as it arrives, so a garbage or oversized frame
    is refused before its bytes are buffered.
    """

    STAGING = 256 * 1024
    LARGE = 64 * 1024  # frames at least this big are received into their own buffer

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, staging: int = STAGING) -> None:
        self.max_frame = max_frame
        self._stage = bytearray(staging)
        self._start = 0  # unparsed bytes are _stage[_start:_end]
        self._end = 0
        self._large: memoryview | None = None  # the frame being received in place (from its length word)
        self._large_have = 0
        self._large_len = 0  # the frame's size (its pooled buffer may be longer)
        self._expect_large = False  # the last frame was large: read only a prefix into the staging area
        self._out: list[Message] = []
        self.bytes_received = 0

    def raise_limits(self, max_frame: int) -> None:
        """After authentication: frames up to ``max_frame``, and the full staging area.

        Before it, a server decodes with ``PREAUTH_MAX_FRAME`` and a staging area
        of that size, so a stranger's connection costs a few KiB whatever it sends.
        """
        self.max_frame = max_frame
        if len(self._stage) < self.STAGING:  # a new area: the transport may still hold a view of the old one
            pending = self._end - self._start
            stage = bytearray(self.STAGING)
            stage[:pending] = self._stage[self._start:self._end]
            self._stage, self._start, self._end = stage, 0, pending

    # ------------------------------------------------------------ buffered protocol
    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes should be written."""
        if self._large is not None:
            # the rest of the frame, and the next frame's prefix where its buffer has room after it: one receive
            # per frame, not one for the frame and one for the prefix that says how large the next one is
            return self._large[self._large_have:min(len(self._large), self._large_len + PREFIX_SIZE)]
        if self._end == len(self._stage):
            self._compact()
        if self._expect_large and self._end - self._start < PREFIX_SIZE:
            # most likely another large frame: take just its prefix here, its body then lands in place
            return memoryview(self._stage)[self._end:self._start + PREFIX_SIZE]
        return memoryview(self._stage)[self._end:]

    def buffer_updated(self, nbytes: int) -> list[Message]:
        """``nbytes`` were written into the last ``get_buffer``; returns the messages they complete."""
        self.bytes_received += nbytes
        if self._large is not None:
            self._large_have += nbytes
            if self._large_have >= self._large_len:
                frame, self._large = self._large, None
                self._expect_large = True
                self._out.append(self._decode_frame(frame[:self._large_len], 0))
                extra = self._large_have - self._large_len  # the next frame's first bytes (its prefix, or part)
                if extra:
                    self._stage[:extra] = frame[self._large_len:self._large_have]
                    self._start, self._end = 0, extra
                    self._parse_stage()
            return self._take()
        self._end += nbytes
        self._parse_stage()
        return self._take()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Add received bytes; returns every message they complete (may be empty)."""
        view = memoryview(data).cast("B")
        out: list[Message] = []
        while len(view):
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            out.extend(self.buffer_updated(n))
        return out

    # ------------------------------------------------------------ internals
    def _take(self) -> list[Message]:
        out, self._out = self._out, []
        return out

    def _compact(self) -> None:
        pending = self._end - self._start
        if self._start:
            self._stage[:pending] = self._stage[self._start:self._end]
        self._start, self._end = 0, pending
        if pending == len(self._stage):  # a frame longer than the staging area but below LARGE cannot happen
            self._stage.extend(bytes(len(self._stage)))

    def _check_prefix(self, buf, pos: int) -> tuple[int, int, int]:
        length, magic, version, mtype, hlen = PREFIX.unpack_from(buf, pos)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x}): not a sparkflow-exchange peer")
        if version != VERSION:
            raise ProtocolError(f"unsupported protocol version {version} (this side speaks {VERSION})")
        if length > self.max_frame:
            raise ProtocolError(f"frame of {length} bytes exceeds the maximum frame size {self.max_frame}")
        if length < PREFIX_SIZE - 4 or hlen > length - (PREFIX_SIZE - 4):
            raise ProtocolError(f"header length {hlen} exceeds frame length {length}")
        return length, mtype, hlen

    def _parse_stage(self) -> None:
        stage = self._stage
        while self._end - self._start >= PREFIX_SIZE:
            pos = self._start
            length, _, _ = self._check_prefix(stage, pos)
            total = 4 + length
            have = self._end - pos
            if total < self.LARGE:
                self._expect_large = False
            if have >= total:
                with memoryview(stage) as view:
                    frame = bytes(view[pos:pos + total]) if total < self.LARGE else bytearray(view[pos:pos + total])
                self._start += total
                self._out.append(self._decode_frame(memoryview(frame), 0))
                continue
            if total >= self.LARGE:  # receive the rest of this frame in place
                large = FRAME_POOL.take(total)
                with memoryview(stage) as view:
                    large[:have] = view[pos:self._end]
                self._large, self._large_have, self._large_len = large, have, total
                self._start = self._end = 0
            break
        if self._start == self._end:
            self._start = self._end = 0

    def _decode_frame(self, frame: memoryview, pos: int) -> Message:
        length, mtype, hlen = self._check_prefix(frame, pos)
        hstart = pos + PREFIX_SIZE
        header = bytes(frame[hstart:hstart + hlen])
        return _decode(mtype, header, frame[hstart + hlen:pos + 4 + length])

    @property
    def pending(self) -> int:
        """Bytes held of an incomplete frame (a peer that vanishes leaves these)."""
        return self._large_have if self._large is not None else self._end - self._start
