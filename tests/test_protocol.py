"""The wire protocol, sans-IO: every message round-trips; every bad frame is refused clearly."""
from __future__ import annotations

import functools
import json
import struct

import pytest

from sparkflow_exchange import buffer_kinds as bk
from sparkflow_exchange.network import protocol as p
from sparkflow_exchange.network.protocol import (
    MAGIC,
    PREFIX,
    PREFIX_SIZE,
    VERSION,
    FrameDecoder,
    MsgType,
    ProtocolError,
    encode,
    encode_bytes,
)

BIG = bytes(range(256)) * 300  # 76,800 bytes

MESSAGES = [
    p.ServerHello("nonce-1", "svc", "host-a"),
    p.Hello("client-7", "ab" * 32, "host-b"),
    p.Welcome("svc", "host-a"),
    p.PartitionRequest("part-0", 3, 42, 2, 17),
    p.AddCredit(42, 5),
    p.ResumeConsumption(42),
    p.CancelPartitionRequest(42),
    p.CloseRequest(),
    p.BufferResponse(42, 9, 3, bk.BufferKind.DATA, bk.FLAG_COMPRESSED, b"payload bytes"),
    p.BufferResponse(-1, 0, 0, bk.BufferKind.END_OF_PARTITION, 0, b""),
    p.BufferResponse(7, 1, 0, 255, 0, "partition failed: boom".encode()),
    p.ErrorResponse("it broke", 42, True, "fatal-code"),
    p.ErrorResponse("connection-level", None, False),
    p.RegisterPartition("part-0", 4, "HYBRID", "ex-1", "attempt-0"),
    p.PartitionRegistered("part-0", 11, 8, 32768),
    p.PushBuffer(11, -1, bk.BufferKind.DATA, 0, b"broadcast"),
    p.PushBuffer(11, 2, bk.BufferKind.MARKER, 1, memoryview(b"marker")),
    p.ProducerCredit(11, 3),
    p.RegisterPartition("part-1", 2, "HYBRID", "ex-1", "attempt-0", 1 << 20, 16, "/dev/shm/sparkflow-arena-1-ab", 16, 1114112),
    p.PartitionRegistered("part-1", 12, 0, 1 << 20, 16),
    p.PushSharedBuffer(12, 1, bk.BufferKind.DATA, 0, 15, 264, 1048576),
    p.SlotsFreed(12, (3, 0, 15)),
    p.PushRegion(11, bk.BufferKind.DATA, 0, ((0, 0, 5), (3, 5, 4), (7, 9, 0)), b"aaaaabbbb"),
    p.PushSharedRegion(12, bk.BufferKind.DATA, bk.FLAG_COMPRESSED, 4, ((1, 264, 1000), (2, 1264, 64))),
    p.SlotsFreed(12, ()),
    p.SharedBuffersRead(42, 3),
    p.PartitionRequest("part-1", 0, 43, 2, 0, True),
    p.BufferResponse(43, 0, 1, bk.BufferKind.DATA, bk.FLAG_SHARED,
                     p.SharedRef("/dev/shm/sparkflow-arena-1-ab", 1 << 20, 4096).pack()),
    p.FinishPartition(11),
    p.FinishPartition(11, {"buffers": [3, 0, 7], "rows": [300, 0, 9000]}),
    p.FailPartition(11, "task killed"),
    p.PartitionFinished(11, {"bytes": 10, "buffers": 2}),
    p.PartitionReleased(11, "partition x of exchange 'e' was released while it was being written: dropped", "replaced"),
    p.RpcRequest(1, "register", {"a": [1, 2], "b": None}),
    p.RpcResponse(1, {"ok": True}),
    p.RpcResponse(2, None, "no such exchange", "not_found"),
    p.Notify("exchange.dropped", {"exchange": "ex-1"}),
]


def _norm(msg):
    """Compare payloads as bytes (the decoder hands out memoryviews)."""
    d = dict(msg.__dict__)
    if "payload" in d:
        d["payload"] = bytes(d["payload"])
    return type(msg), d


def test_every_message_type_is_covered():
    covered = {type(m) for m in MESSAGES}
    assert covered == set(p._TYPE_OF), set(p._TYPE_OF) - covered
    assert {p._TYPE_OF[c] for c in covered} == set(MsgType)


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip_single_feed(msg):
    dec = FrameDecoder()
    out = dec.feed(encode_bytes(msg))
    assert len(out) == 1
    assert _norm(out[0]) == _norm(msg)
    assert dec.pending == 0


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip_byte_by_byte(msg):
    data = encode_bytes(msg)
    dec = FrameDecoder()
    out = []
    for i in range(len(data)):
        got = dec.feed(data[i : i + 1])
        if i < len(data) - 1:
            assert got == [], f"message completed early at byte {i} of {len(data)}"
            assert dec.pending == i + 1
        out.extend(got)
    assert [_norm(m) for m in out] == [_norm(msg)]
    assert dec.pending == 0
    assert dec.bytes_received == len(data)


def test_encode_pieces_do_not_copy_payload_and_length_counts_rest():
    payload = memoryview(BIG)
    pieces = encode(p.BufferResponse(1, 2, 3, 0, 0, payload))
    assert len(pieces) == 2 and pieces[1] is payload
    frame = b"".join(bytes(x) for x in pieces)
    length, magic, version, mtype, hlen = PREFIX.unpack_from(frame)
    assert length == len(frame) - 4
    assert (magic, version, mtype) == (MAGIC, VERSION, MsgType.BUFFER_RESPONSE)
    assert hlen == struct.calcsize(">qqiBB")


@pytest.mark.parametrize("chunk", [1, 7, 4096, 65536])
def test_large_payload_split_across_many_feeds(chunk):
    msg = p.BufferResponse(5, 123456789, 77, bk.BufferKind.DATA, 0, BIG)
    data = encode_bytes(msg)
    dec = FrameDecoder()
    out = []
    for i in range(0, len(data), chunk):
        out.extend(dec.feed(memoryview(data)[i : i + chunk]))
    assert len(out) == 1
    assert bytes(out[0].payload) == BIG
    assert (out[0].receiver_id, out[0].seq, out[0].backlog) == (5, 123456789, 77)


def test_several_frames_in_one_feed_and_split_frames_across_feeds():
    data = b"".join(encode_bytes(m) for m in MESSAGES)
    dec = FrameDecoder()
    assert [_norm(m) for m in dec.feed(data)] == [_norm(m) for m in MESSAGES]
    assert dec.pending == 0
    # the same stream cut at awkward places: each feed yields what it completes
    dec = FrameDecoder()
    out = []
    cuts = [0, 3, 5, 14, 15, 100, 101, 250, len(data) - 1, len(data)]
    for a, b in zip(cuts, cuts[1:]):
        out.extend(dec.feed(data[a:b]))
    assert [_norm(m) for m in out] == [_norm(m) for m in MESSAGES]
    assert dec.pending == 0


def _received_like_a_socket(dec: FrameDecoder, stream: bytes) -> tuple[list, int]:
    """What a buffered protocol gets when every receive fills the buffer the decoder offers (a busy socket):
    the messages, and how many receives it took."""
    out, pos, receives = [], 0, 0
    while pos < len(stream):
        target = dec.get_buffer(-1)
        n = min(len(target), len(stream) - pos)
        target[:n] = stream[pos:pos + n]
        pos += n
        receives += 1
        out.extend(dec.buffer_updated(n))
    return out, receives


def test_consecutive_large_frames_take_one_receive_each_with_the_next_prefix():
    """A large frame's receive also takes the next frame's prefix (its pooled buffer has room after it), so a
    stream of large frames costs one receive per frame, not two; small frames between them still decode."""
    sizes = [700_000, 300_001, 5, 1_000_000, 90_000, 64 * 1024, 5, 5, 450_000]
    msgs = [p.BufferResponse(3, i, 0, bk.BufferKind.DATA, 0, bytes([i]) * n) for i, n in enumerate(sizes)]
    stream = b"".join(encode_bytes(m) for m in msgs)
    out, receives = _received_like_a_socket(FrameDecoder(), stream)
    assert [_norm(m) for m in out] == [_norm(m) for m in msgs]
    large = sum(1 for n in sizes if n >= FrameDecoder.LARGE)
    assert receives <= len(sizes) + 2  # the first prefix, then about one per frame
    assert receives < 2 * large  # (a prefix receive and a body receive per large frame would be 12 or more)


def test_a_large_frame_that_fills_its_buffer_exactly_still_finds_the_next_one():
    """No room after a frame (its size a multiple of the pool's grain): the next prefix comes on its own."""
    header = PREFIX_SIZE + struct.calcsize(">qqiBB")
    exact = p._FramePool.GRAIN * 2 - header
    msgs = [p.BufferResponse(1, i, 0, bk.BufferKind.DATA, 0, bytes([i + 1]) * n)
            for i, n in enumerate([exact, exact, 70_000, exact - 1, 9])]
    stream = b"".join(encode_bytes(m) for m in msgs)
    for chunk in (None, 13, 4096):
        dec = FrameDecoder()
        if chunk is None:
            out, _ = _received_like_a_socket(dec, stream)
        else:
            out = [m for i in range(0, len(stream), chunk) for m in dec.feed(stream[i:i + chunk])]
        assert [_norm(m) for m in out] == [_norm(m) for m in msgs]
        assert dec.pending == 0


def test_decoded_payload_survives_later_feeds():
    """The payload is a copy: later feeds (which compact the buffer) must not alter it."""
    dec = FrameDecoder()
    first = dec.feed(encode_bytes(p.BufferResponse(1, 0, 0, 0, 0, b"A" * 100)))[0]
    dec.feed(encode_bytes(p.BufferResponse(1, 1, 0, 0, 0, b"B" * 100))[:50])
    dec.feed(encode_bytes(p.BufferResponse(1, 1, 0, 0, 0, b"B" * 100))[50:])
    assert bytes(first.payload) == b"A" * 100


def test_shared_ref_round_trips_and_refuses_garbage():
    ref = p.SharedRef("/dev/shm/sparkflow-arena-7-00ff", 3 << 20, 65536)
    assert p.SharedRef.unpack(memoryview(ref.pack())) == ref
    with pytest.raises(ProtocolError, match="too short"):
        p.SharedRef.unpack(b"\x00" * 12)
    with pytest.raises(ProtocolError, match="no readable path"):
        p.SharedRef.unpack(b"\x00" * 12 + b"\xff\xfe")


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError, match="not a protocol message"):
        encode({"type": "hello"})


# ------------------------------------------------------------------ bad input
def _raw(mtype: int, header: bytes, payload: bytes = b"", *, magic=MAGIC, version=VERSION, length=None, hlen=None):
    if length is None:
        length = PREFIX_SIZE - 4 + len(header) + len(payload)
    if hlen is None:
        hlen = len(header)
    return PREFIX.pack(length, magic, version, mtype, hlen) + header + payload


def _refused(data: bytes, match: str, max_frame: int = p.DEFAULT_MAX_FRAME):
    with pytest.raises(ProtocolError, match=match):
        FrameDecoder(max_frame).feed(data)


def test_bad_magic():
    data = bytearray(encode_bytes(p.CloseRequest()))
    data[4:8] = b"HTTP"
    _refused(bytes(data), r"bad magic 0x48545450")


def test_http_request_is_bad_magic():
    _refused(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad magic")


def test_wrong_version():
    _refused(_raw(MsgType.CLOSE_REQUEST, b"{}", version=VERSION + 1), rf"unsupported protocol version {VERSION + 1}")


def test_oversized_length_refused_from_prefix_alone():
    # only the 14-byte prefix arrives: refused before any body is buffered
    prefix = PREFIX.pack(1_000_001, MAGIC, VERSION, MsgType.BUFFER_RESPONSE, 22)
    with pytest.raises(ProtocolError, match=r"frame of 1000001 bytes exceeds the maximum frame size 1000000"):
        FrameDecoder(1_000_000).feed(prefix)


def test_frame_at_max_frame_is_accepted():
    msg = p.BufferResponse(1, 0, 0, 0, 0, b"x" * 100)
    data = encode_bytes(msg)
    assert len(FrameDecoder(len(data) - 4).feed(data)) == 1
    _refused(data, "exceeds the maximum frame size", max_frame=len(data) - 5)


def test_unknown_type():
    _refused(_raw(99, b"{}"), r"unknown message type 99")


def test_header_length_greater_than_frame():
    _refused(_raw(MsgType.CLOSE_REQUEST, b"{}", hlen=1000), r"header length 1000 exceeds frame length 12")


def test_length_shorter_than_prefix():
    _refused(_raw(MsgType.CLOSE_REQUEST, b"", length=3), r"header length 0 exceeds frame length 3")


def test_malformed_json_header():
    _refused(_raw(MsgType.PARTITION_REQUEST, b"{not json"), r"malformed PARTITION_REQUEST frame")


def test_non_utf8_header():
    _refused(_raw(MsgType.HELLO, b"\xff\xfe\x00"), r"malformed HELLO frame")


def test_json_header_not_an_object():
    _refused(_raw(MsgType.HELLO, b"[1,2]"), r"HELLO header is not an object")


def test_json_header_unknown_field():
    header = json.dumps({"receiver_id": 1, "bogus": 2}).encode()
    _refused(_raw(MsgType.RESUME_CONSUMPTION, header), r"malformed RESUME_CONSUMPTION frame.*bogus")


def test_json_header_missing_field():
    header = json.dumps({"partition": "p"}).encode()
    _refused(_raw(MsgType.PARTITION_REQUEST, header), r"malformed PARTITION_REQUEST frame.*missing")


@pytest.mark.parametrize(
    "mtype, header",
    [
        (MsgType.BUFFER_RESPONSE, b"\x00" * 5),
        (MsgType.ADD_CREDIT, b"\x00" * 13),
        (MsgType.PUSH_BUFFER, b""),
        (MsgType.PRODUCER_CREDIT, b"\x00" * 11),
    ],
    ids=lambda x: getattr(x, "name", None) or str(len(x)),
)
def test_binary_header_of_wrong_size(mtype, header):
    _refused(_raw(mtype, header), rf"malformed {MsgType(mtype).name} frame")


def test_error_raised_even_after_good_frames_in_same_feed():
    dec = FrameDecoder()
    good = encode_bytes(p.AddCredit(1, 1))
    with pytest.raises(ProtocolError, match="bad magic"):
        dec.feed(good + b"\x00" * 4 + b"XXXX" + b"\x01\x01\x00\x00\x00\x00")


@pytest.mark.parametrize(
    "mtype, fields, bad",
    [
        (MsgType.PARTITION_REQUEST, {"partition": "p", "subpartition": "0", "receiver_id": 1, "initial_credit": 2}, "subpartition"),
        (MsgType.PARTITION_REQUEST, {"partition": "p", "subpartition": 0, "receiver_id": 1, "initial_credit": None}, "initial_credit"),
        (MsgType.PARTITION_REQUEST, {"partition": 5, "subpartition": 0, "receiver_id": 1, "initial_credit": 2}, "partition"),
        (MsgType.RESUME_CONSUMPTION, {"receiver_id": 1.5}, "receiver_id"),
        (MsgType.FINISH_PARTITION, {"handle": True}, "handle"),
        (MsgType.ERROR_RESPONSE, {"message": "m", "receiver_id": "7"}, "receiver_id"),
        (MsgType.RPC_REQUEST, {"call_id": 1, "method": "m", "args": []}, "args"),
    ],
)
def test_json_header_field_of_wrong_type(mtype, fields, bad):
    """A string where an int belongs must be refused here, not fail later inside the server."""
    _refused(_raw(mtype, json.dumps(fields).encode()), rf"malformed {MsgType(mtype).name} frame: field '{bad}'")


def test_json_header_optional_and_any_fields_accept_their_types():
    dec = FrameDecoder()
    msgs = [
        p.ErrorResponse("m", None, True),
        p.RpcResponse(3, [1, "two", None]),
        p.RpcResponse(4, "text", None),
    ]
    assert dec.feed(b"".join(encode_bytes(m) for m in msgs)) == msgs


def _region_frame(mtype: int, header: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(PREFIX_SIZE - 4 + len(header) + len(payload), MAGIC, VERSION, mtype, len(header)) + header + payload


@pytest.mark.parametrize("header, payload, why", [
    (struct.pack(">qBBI", 1, 0, 0, 0), b"", "0 pieces"),
    (struct.pack(">qBBI", 1, 0, 0, 2) + struct.pack(">iII", 0, 0, 1), b"x", "2 pieces announced"),
    (struct.pack(">qBBI", 1, 0, 0, 1) + struct.pack(">iII", 0, 2, 4), b"abc", "outside the region's 3 bytes"),
])
def test_region_pieces_are_checked(header, payload, why):
    with pytest.raises(ProtocolError, match=why):
        FrameDecoder().feed(_region_frame(MsgType.PUSH_REGION, header, payload))


def test_shared_region_needs_pieces():
    header = struct.pack(">qBBiI", 1, 0, 0, 3, 0)
    with pytest.raises(ProtocolError, match="0 pieces"):
        FrameDecoder().feed(_region_frame(MsgType.PUSH_SHARED_REGION, header))


def test_json_nesting_depth_is_measured_before_parsing():
    from sparkflow_exchange.network.protocol import json_nests_deeper

    def nested(depth: int) -> bytes:
        return json.dumps(functools.reduce(lambda inner, i: [inner] if i % 2 else {"k": inner}, range(depth), 1)).encode()

    for depth in (0, 1, 5, 63, 64, 65, 200):
        assert json_nests_deeper(nested(depth), 64) is (depth > 64), depth
    # brackets in strings (escaped quotes too) are not nesting; many shallow ones are not deep
    assert not json_nests_deeper(json.dumps({"a": "[{" * 500, "b": '\\"[[[' * 100}).encode(), 64)
    assert not json_nests_deeper(json.dumps([{"p": [i, {"x": [1]}]} for i in range(50_000)]).encode(), 64)
    assert json_nests_deeper(json.dumps({"a": '"[', "b": [[[[1]]]]}).encode(), 3)
    assert json_nests_deeper(b'{"a": ' + b"[" * 70, 64)  # unclosed: json.loads would still recurse that deep
    assert not json_nests_deeper(b"]" * 100 + b"[[1]]", 64)
    # closing brackets in a string hide no depth; strings side by side pair up only with their own quotes
    hidden = json.dumps(["]" * 30, functools.reduce(lambda inner, _: [inner], range(70), 1)]).encode()
    assert json_nests_deeper(hidden, 64)
    assert not json_nests_deeper(json.dumps(["x", "[", "y", "]" * 80, "[" * 80]).encode(), 64)
