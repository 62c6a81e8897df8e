"""Unit tests of the plugin's sans-IO Java classes, without Spark: a second or two per test.

``jvm-stub/src/test/java/.../UnitDriver.java`` (compiled against the built jar) runs ``Frames`` and ``SpillIndex`` on
bytes that Python made, and Python reads what they made: frames split anywhere decode the same in both languages, bad
frames are refused by both, and a spill index written by the service is read by the JVM entry for entry, or refused
with the reason the Python reader gives.
"""
from __future__ import annotations

import json
import shutil

import pytest

from jvm_units import compile_driver
from sparkflow_exchange.buffer_kinds import BROADCAST, END_COUNTS, BufferKind
from sparkflow_exchange.network import protocol
from sparkflow_exchange.network.protocol import (AddCredit, BufferResponse, FrameDecoder, Hello, PartitionReleased,
                                                 ProtocolError, PushBuffer, RpcResponse, encode_bytes)
from sparkflow_exchange.partition import spill

DATA, END, MARKER = BufferKind.DATA, BufferKind.END_OF_PARTITION, BufferKind.MARKER


@pytest.fixture(scope="module")
def jvm(jar, tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    return compile_driver(jar, tmp_path_factory.mktemp("jvm-units"))


def split_frames(data: bytes) -> list[dict]:
    """The frames of ``data`` by their prefix, as the driver reports them."""
    out, pos = [], 0
    while pos < len(data):
        length, _magic, _version, mtype, header_len = protocol.PREFIX.unpack_from(data, pos)
        header = data[pos + protocol.PREFIX_SIZE:pos + protocol.PREFIX_SIZE + header_len]
        payload = data[pos + protocol.PREFIX_SIZE + header_len:pos + 4 + length]
        out.append({"type": mtype, "header_hex": header.hex(), "payload": payload.hex()})
        pos += 4 + length
    return out


def test_frames_python_encodes_decode_in_the_jvm_however_they_are_split(jvm):
    messages = [Hello("client-1", "ab" * 32, "host-é", "cd" * 16), AddCredit(7, 3),
                BufferResponse(1, 2, 0, DATA, 0, b"\x00payload\xff" * 100), RpcResponse(4, {"x": [1, 2]}),
                PartitionReleased(9, "dropped", "replaced"), BufferResponse(1, 3, 0, END, 0, END_COUNTS.pack(1, 10))]
    data = b"".join(encode_bytes(m) for m in messages)
    expected = split_frames(data)
    assert [f["type"] for f in expected] == [protocol.MsgType.HELLO, protocol.MsgType.ADD_CREDIT,
                                             protocol.MsgType.BUFFER_RESPONSE, protocol.MsgType.RPC_RESPONSE,
                                             protocol.MsgType.PARTITION_RELEASED, protocol.MsgType.BUFFER_RESPONSE]
    answers = jvm([{"op": "decode", "hex": data.hex(), "chunk": chunk} for chunk in (1, 3, 13, len(data))])
    for answer in answers:
        assert [{k: f[k] for k in ("type", "header_hex", "payload")} for f in answer["frames"]] == expected
    assert json.loads(answers[0]["frames"][0]["header"])["host_id"] == "host-é"  # the JSON header as UTF-8 text


def test_frames_the_jvm_encodes_decode_in_python(jvm):
    payload = b"arrow ipc bytes"
    hello, credit, push = jvm([
        {"op": "encode", "type": protocol.MsgType.HELLO,
         "header": '{"client_id": "jvm-1", "proof": "", "host_id": "h", "nonce": ""}'},
        {"op": "encode", "type": protocol.MsgType.ADD_CREDIT, "header_hex": protocol._ADD_CREDIT.pack(7, 3).hex()},
        {"op": "encode", "type": protocol.MsgType.PUSH_BUFFER, "payload_length": len(payload),
         "header_hex": protocol._PUSH_BUFFER.pack(5, BROADCAST, DATA, 0).hex()},
    ])
    decoder = FrameDecoder()
    assert decoder.feed(bytes.fromhex(hello["hex"])) == [Hello("jvm-1", "", "h", "")]
    assert decoder.feed(bytes.fromhex(credit["hex"])) == [AddCredit(7, 3)]
    [pushed] = decoder.feed(bytes.fromhex(push["hex"]) + payload)  # the payload follows the encoded prefix and header
    assert isinstance(pushed, PushBuffer) and (pushed.handle, pushed.subpartition, bytes(pushed.payload)) == \
        (5, BROADCAST, payload)


def test_bad_frames_are_refused_by_the_jvm_and_python_alike(jvm):
    good = encode_bytes(AddCredit(7, 3))
    cases = {
        "bad magic": good[:4] + b"XXXX" + good[8:],
        "unsupported protocol version": good[:8] + bytes([protocol.VERSION - 1]) + good[9:],
        "is outside 10..": protocol.PREFIX.pack(2048, protocol.MAGIC, protocol.VERSION, 11, 0),
        "exceeds frame length": protocol.PREFIX.pack(20, protocol.MAGIC, protocol.VERSION, 11, 100),
    }
    answers = jvm([{"op": "decode", "hex": data.hex(), "chunk": 2, "max_frame": 1024} for data in cases.values()])
    for (what, data), answer in zip(cases.items(), answers):
        assert what in answer.get("error", ""), (what, answer)
        with pytest.raises(ProtocolError):
            FrameDecoder(max_frame=1024).feed(data)


# ------------------------------------------------------------------ the spill index
def write_spill(tmp_path, entries: list[tuple[int, int, int, int, int, int]], data: bytes = b"x" * 100):
    f = spill.SpillFile(tmp_path / "p.data")
    f.append(data)
    f.write_index(entries)
    f.close()
    return f


# two subpartitions; a broadcast buffer stored once and indexed by both; entries out of order in the file
ENTRIES = [(1, 0, 0, 10, DATA, 1), (0, 0, 10, 20, DATA, 0), (0, 1, 0, 10, DATA, 1), (1, 1, 30, 5, MARKER, 0),
           (0, 2, 35, 16, END, 0), (1, 2, 51, 16, END, 0)]


def test_the_jvm_reads_a_spill_index_the_service_wrote_entry_for_entry(jvm, tmp_path):
    f = write_spill(tmp_path, ENTRIES)
    answers = jvm([{"op": "spill", "index": str(f.index_path), "subpartition": s, "data_size": f.size} for s in (0, 1)])
    for sub, answer in zip((0, 1), answers):
        python = spill.read_index(f.index_path, sub, data_size=f.size)
        assert [[e[k] for k in ("seq", "offset", "length", "kind", "flags")] for e in answer["entries"]] == \
            [list(e) for e in python]


@pytest.mark.parametrize("entries, damage, reason", [
    (ENTRIES, lambda b: b[:-3], "not a whole number of 26-byte entries"),
    (ENTRIES, lambda b: b"SFXIDX00" + b[8:], "does not start with the index magic"),
    ([e for e in ENTRIES if e[:2] != (0, 1)], None, "sequence numbers"),
    ([e for e in ENTRIES if e[:2] != (0, 2)], None, "end-of-partition"),
    ([*ENTRIES[:-1], (1, 2, 51, 16, 7, 0)], None, "unknown buffer kind 7"),
    ([*ENTRIES[:-1], (1, 2, 95, 16, END, 0)], None, "reaches byte 111 of a data file of 100 bytes"),
])
def test_a_damaged_spill_index_is_refused_by_the_jvm_as_by_python(jvm, tmp_path, entries, damage, reason):
    f = write_spill(tmp_path, entries)
    if damage is not None:
        f.index_path.write_bytes(damage(f.index_path.read_bytes()))
    answers = jvm([{"op": "spill", "index": str(f.index_path), "subpartition": s, "data_size": f.size} for s in (0, 1)])
    assert any(reason in a.get("error", "") for a in answers), answers
    with pytest.raises(spill.SpillCorruptError):
        for s in (0, 1):
            spill.read_index(f.index_path, s, data_size=f.size)


@pytest.mark.parametrize("epoch", [0, 7, 2**40 + 3])
def test_the_jvm_sinks_epoch_marker_is_the_one_the_python_reader_expects(jvm, epoch):
    from sparkflow_exchange.buffer_kinds import epoch_marker

    assert jvm([{"op": "epoch_marker", "epoch": epoch}])[0]["hex"] == epoch_marker(epoch).hex()


def test_a_stream_offset_of_either_route_is_read_by_the_jvm_source(jvm):
    python_offset = {"epochs": {"s": 5}, "group": "g"}  # what the Python source writes to its checkpoint
    real_time = {"epochs": {"s": 4}, "group": "query-1",
                 "subpartitions": {"0": {"epoch": 5, "rows": {"s#5.0.0-0-1.ab": 12}}, "1": {"epoch": 6, "rows": {}}}}
    answers = jvm([{"op": "stream_offset", "stream": "s", "json": json.dumps(o)} for o in (python_offset, real_time)]
                  + [{"op": "stream_offset", "stream": "other", "json": json.dumps(python_offset)}])
    assert json.loads(answers[0]["json"]) == python_offset
    assert json.loads(answers[1]["json"]) == real_time
    assert "not one of exchange 'other'" in answers[2]["error"]
