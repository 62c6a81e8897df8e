"""Unit tests of the plugin's sans-IO Java classes, without Spark: a second or a few per test.

``jvm-stub/src/test/java/.../UnitDriver.java`` and its probes (compiled against the built jar) run the classes on
inputs Python made, and Python checks what they answer against its own definitions where it has one:

- ``Frames``: frames split anywhere decode the same in both languages, bad frames are refused by both;
- ``SpillIndex``: a spill index written by the service is read entry for entry, or refused with the reason the
  Python reader gives;
- ``Handshake``: the JVM's Hello is byte for byte the one Python's client makes for the same nonces and secret, the
  Python service takes it, and a Welcome whose proof is not the service's is refused as Python's client refuses it;
- ``LiveProducers``: which attempts a read of an exchange being written takes, and when its state is one commit;
- ``WriteSettings`` and ``ReadLayout``: the options' values as parsed, and each bad value refused naming its key;
- ``Route``: which options and exchanges the JVM path serves, and why the rest go to the Python source;
- ``KeyFilter``: the subpartitions it keeps are exactly those the Python writer put the filter's key values in.
"""
from __future__ import annotations

import itertools
import json
import re
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from jvm_units import compile_driver

from sparkflow_exchange.buffer_kinds import BROADCAST, END_COUNTS, BufferKind
from sparkflow_exchange.errors import ServiceError
from sparkflow_exchange.kinds import ExchangeState
from sparkflow_exchange.network import auth, protocol
from sparkflow_exchange.network.connection import ClientHandshake, ServerHandshake
from sparkflow_exchange.network.protocol import (
    AddCredit,
    BufferResponse,
    ErrorResponse,
    FrameDecoder,
    Hello,
    PartitionReleased,
    ProtocolError,
    PushBuffer,
    RpcResponse,
    ServerHello,
    Welcome,
    encode_bytes,
)
from sparkflow_exchange.partition import spill
from sparkflow_exchange.service.exchange_lifecycle import Lifecycle, read_verdict
from sparkflow_exchange.writer.selectors import HashSelector

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


DAMAGED_INDEXES = [  # (entries, damage to the index file's bytes, what the refusal says)
    (ENTRIES, lambda b: b[:-3], "not a whole number of 26-byte entries"),
    (ENTRIES, lambda b: b"SFXIDX00" + b[8:], "does not start with the index magic"),
    ([e for e in ENTRIES if e[:2] != (0, 1)], None, "sequence numbers"),
    ([e for e in ENTRIES if e[:2] != (0, 2)], None, "end-of-partition"),
    ([*ENTRIES[:-1], (1, 2, 51, 16, 7, 0)], None, "unknown buffer kind 7"),
    ([*ENTRIES[:-1], (1, 2, 95, 16, END, 0)], None, "reaches byte 111 of a data file of 100 bytes"),
]


def test_a_damaged_spill_index_is_refused_by_the_jvm_as_by_python(jvm, tmp_path):
    requests = []
    for i, (entries, damage, _) in enumerate(DAMAGED_INDEXES):
        (tmp_path / str(i)).mkdir()
        f = write_spill(tmp_path / str(i), entries)
        if damage is not None:
            f.index_path.write_bytes(damage(f.index_path.read_bytes()))
        with pytest.raises(spill.SpillCorruptError):
            for s in (0, 1):
                spill.read_index(f.index_path, s, data_size=f.size)
        requests += [{"op": "spill", "index": str(f.index_path), "subpartition": s, "data_size": f.size} for s in (0, 1)]
    answers = jvm(requests)
    for i, (_, _, reason) in enumerate(DAMAGED_INDEXES):
        assert any(reason in a.get("error", "") for a in answers[2 * i:2 * i + 2]), (reason, answers[2 * i:2 * i + 2])


def test_big_frames_fed_in_pieces_and_too_short_frames_alike_in_both_languages(jvm):
    """A frame larger than the decoder's first buffer, fed in pieces, grows it; a length shorter than a prefix is
    refused by both."""
    big = encode_bytes(BufferResponse(1, 2, 0, DATA, 0, bytes(range(256)) * 1000))  # 256 kB
    empty_header = protocol.PREFIX.pack(protocol.PREFIX_SIZE - 4, protocol.MAGIC, protocol.VERSION,
                                        protocol.MsgType.NOTIFY, 0)
    data = big + empty_header + big
    short = protocol.PREFIX.pack(5, protocol.MAGIC, protocol.VERSION, 11, 0)
    pieces, whole, refused = jvm([{"op": "decode", "hex": data.hex(), "chunk": 7000},
                                  {"op": "decode", "hex": data.hex()},
                                  {"op": "decode", "hex": short.hex(), "chunk": 3}])
    expected = split_frames(data)
    for answer in (pieces, whole):
        assert [{k: f[k] for k in ("type", "header_hex", "payload")} for f in answer["frames"]] == expected
    assert "frame of 5 bytes is outside 10.." in refused.get("error", ""), refused
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(short)


def test_payloads_land_in_the_readers_memory_fed_in_pieces_or_read_straight_in(jvm):
    """A reader receives a data buffer's payload into its own memory (no byte array between the socket and the
    decoder): fed in pieces of any size or read straight into place, every frame is what Python encoded, only the
    frames asked for land, and a frame cut off mid-payload lets go of the memory it had (the driver fails on any
    landing left open)."""
    big = encode_bytes(BufferResponse(1, 2, 0, DATA, 0, bytes(range(256)) * 1000))
    data = big + encode_bytes(AddCredit(7, 3)) + encode_bytes(BufferResponse(1, 3, 0, DATA, 0, b"x")) + big
    expected = split_frames(data)
    land = int(protocol.MsgType.BUFFER_RESPONSE)
    answers = jvm([{"op": "decode", "hex": data.hex(), "chunk": chunk, "land": land, "direct": direct}
                   for chunk, direct in ((1, 0), (7000, 0), (7000, 1), (65536, 4096), (len(data), 1))])
    for answer in answers:
        assert [{k: f[k] for k in ("type", "header_hex", "payload")} for f in answer["frames"]] == expected, answer
        assert [f["landed"] for f in answer["frames"]] == [True, False, True, True]
    [cut] = jvm([{"op": "decode", "hex": (big + big[:len(big) // 2]).hex(), "chunk": 5000, "land": land, "direct": 1}])
    assert "error" not in cut, cut
    assert [f["payload"] for f in cut["frames"]] == [expected[0]["payload"]]


def test_a_spill_index_without_the_subpartition_or_with_a_negative_offset_is_refused(jvm, tmp_path):
    f = write_spill(tmp_path, ENTRIES)
    negative = tmp_path / "negative.index"
    negative.write_bytes(spill.INDEX_MAGIC + spill.INDEX_ENTRY.pack(0, 0, -8, 8, DATA, 0) +
                         spill.INDEX_ENTRY.pack(0, 1, 10, 16, END, 0))
    missing, below = jvm([{"op": "spill", "index": str(f.index_path), "subpartition": 2, "data_size": f.size},
                          {"op": "spill", "index": str(negative), "subpartition": 0, "data_size": 100}])
    assert "subpartition 2 has no entries" in missing.get("error", ""), missing
    assert "negative offset or length" in below.get("error", ""), below


# ------------------------------------------------------------------ the handshake
SECRET, CLIENT_NONCE, SERVER_NONCE = "s3cret-0123456789", "0123456789abcdef" * 2, "fedcba9876543210" * 2


def python_service(secret: str | None = SECRET, service_id: str = "svc-1") -> ServerHandshake:
    """Python's service side of one connection, greeting with SERVER_NONCE."""
    server = ServerHandshake({auth.OPERATOR: secret} if secret else {}, service_id, "svc-host")
    server.nonce = SERVER_NONCE
    return server


def python_client(secret: str | None = SECRET) -> ClientHandshake:
    """Python's client side of one connection, answering with CLIENT_NONCE."""
    client = ClientHandshake(secret, "jvm-host", "test-peer")
    client.nonce = CLIENT_NONCE
    return client


def jvm_handshake(secret: str | None, *messages) -> dict:
    return {"op": "handshake", "secret": secret, "host_id": "jvm-host", "nonce": CLIENT_NONCE,
            "frames": [encode_bytes(m).hex() for m in messages]}


def test_the_jvm_says_the_hello_pythons_client_says_and_pythons_service_takes_it(jvm):
    """Same secret, nonces and service: the JVM's Hello is Python's byte for byte (but the client id, which names the
    process), the Python service accepts its proof, and the JVM accepts the Python service's Welcome; without a
    secret, both prove nothing."""
    secrets = [SECRET, None]
    greetings = [python_service(secret).greeting() for secret in secrets]
    hellos = [python_client(secret).step(greeting) for secret, greeting in zip(secrets, greetings)]
    welcomes = [python_service(secret).on_hello(hello) for secret, hello in zip(secrets, hellos)]
    answers = jvm([jvm_handshake(*shake) for shake in zip(secrets, greetings, welcomes)])
    for secret, python_hello, welcome, answer in zip(secrets, hellos, welcomes, answers):
        shake = answer["handshake"]
        assert "error" not in shake and shake["open"] and shake["sent"][1] is None, shake
        sent = bytes.fromhex(shake["sent"][0])
        [jvm_hello] = FrameDecoder().feed(sent)
        assert jvm_hello.client_id.endswith(":jvm")
        assert sent == encode_bytes(replace(python_hello, client_id=jvm_hello.client_id))
        assert jvm_hello.proof == auth.prove(secret, SERVER_NONCE, CLIENT_NONCE, "svc-1")  # "" without a secret
        assert python_service(secret).on_hello(jvm_hello) == welcome


def test_a_welcome_that_does_not_prove_the_secret_for_this_connection_is_refused_as_python_refuses_it(jvm):
    greeting = python_service().greeting()
    forged = {
        "made for another service": auth.prove_service(SECRET, CLIENT_NONCE, SERVER_NONCE, "svc-other"),
        "made with another secret": auth.prove_service("another-secret", CLIENT_NONCE, SERVER_NONCE, "svc-1"),
        "the nonces swapped": auth.prove_service(SECRET, SERVER_NONCE, CLIENT_NONCE, "svc-1"),
        "the client's own proof sent back": auth.prove(SECRET, SERVER_NONCE, CLIENT_NONCE, "svc-1"),
        "no proof": "",
    }
    welcomes = {what: Welcome("svc-1", "svc-host", proof) for what, proof in forged.items()}
    answers = jvm([jvm_handshake(SECRET, greeting, w) for w in welcomes.values()])
    for (what, welcome), answer in zip(welcomes.items(), answers):
        shake = answer["handshake"]
        assert shake["code"] == "auth" and "did not prove the shared secret" in shake["error"], (what, shake)
        assert not shake["open"] and len(shake["sent"]) == 1, (what, shake)  # the Hello went, nothing after
        client = python_client()
        client.step(greeting)
        with pytest.raises(ServiceError, match="not trusted"):
            client.step(welcome)


def test_the_jvm_refuses_a_greeting_out_of_turn_a_shifting_nonce_and_says_a_services_refusal(jvm):
    good = python_service().greeting()
    early, shifting, refusal, unproven = jvm([
        jvm_handshake(SECRET, Welcome("svc-1", "svc-host", "")),
        jvm_handshake(SECRET, ServerHello("ab" * 15 + ":x", "svc-1", "svc-host")),
        jvm_handshake(SECRET, ErrorResponse("too many connections", code="too_many_connections")),
        jvm_handshake(None, ServerHello("not hex at all", "svc-1", "svc-host"), Welcome("svc-1", "svc-host", "")),
    ])
    assert early["handshake"]["code"] == "protocol" and "during the handshake" in early["handshake"]["error"]
    assert shifting["handshake"]["code"] == "protocol" and shifting["handshake"]["sent"] == []  # nothing proven
    assert "not 32 lowercase hex digits" in shifting["handshake"]["error"]
    assert refusal["handshake"]["code"] == "too_many_connections"
    assert refusal["handshake"]["error"].startswith("ServiceUnavailable: ") and "too many connections" in \
        refusal["handshake"]["error"]
    assert unproven["handshake"]["open"], unproven  # without a secret there is nothing to prove: any nonce will do
    assert good.nonce == SERVER_NONCE


# ------------------------------------------------------------------ a read of an exchange being written
def described(epoch: int, producers: list[tuple[str, str]], committed: list[str], seal_ends: list[int],
              state: str = "open") -> dict:
    """A coordinator description (``get_exchange``) for LiveProducers: (partition, state) per registered attempt."""
    states = dict(producers)
    return {"name": "live", "epoch": epoch, "state": state, "sealed": False, "schema": "",
            "producers": [{"partition": p, "index": i, "state": st, "location": {}}
                          for i, (p, st) in enumerate(producers)],
            "committed": committed, "seal_ends": seal_ends,
            "readable": verdict("live", state, False, 2, [states[p] for p in committed])}


def verdict(name: str, state: str, sealed: bool, width: int | None, committed_states: list[str]) -> dict:
    """The coordinator's read verdict (its lifecycle's ``read_verdict``) for such an exchange, as it sends it."""
    life = Lifecycle(name, state=ExchangeState(state), commits=1 if sealed else 0,
                     open_writes=set() if sealed or state != "open" else {"w1"}, reason="a task failed")
    return read_verdict(life, width, [(i, f"p{i}", st) for i, st in enumerate(committed_states)]).to_dict()


def live(seal: int, *steps: dict, epoch: int = 1) -> dict:
    return {"op": "live", "exchange": "live", "epoch": epoch, "seal": seal, "steps": list(steps)}


def update(description: dict) -> dict:
    return {"do": "update", "description": description}


def step(do: str, partition: str = "", rows: int = 0) -> dict:
    return {"do": do, "partition": partition, "rows": rows}


def test_live_producers_take_every_attempt_until_the_seal_then_exactly_the_seals(jvm):
    """Planned after one seal: before the next seal it takes every registered attempt that has not failed; once
    that seal happened, exactly the producers it holds (not a later write's); rows of an attempt the seal does not
    hold make the read not one committed state. Each attempt is read once (all the read partition's subpartitions of
    it together): once complete, nothing is left to take."""
    [answer] = jvm([live(
        1,
        step("started"),
        update(described(1, [("old", "finished"), ("a", "running"), ("b", "failed")], ["old"], [1])),
        step("started"), step("next"), step("finished", "old", 10), step("next"), step("finished", "a", 5),
        step("next"), step("complete"),
        # the seal: "a" lost to "c"; "later" belongs to a write declared after it
        update(described(1, [("old", "finished"), ("c", "finished"), ("later", "finished")], ["old", "c", "later"],
                         [1, 2])),
        step("next"), step("finished", "c", 7), step("next"), step("complete"), step("not_committed"),
        step("next"), step("complete"))])
    r = answer["results"]
    assert r[0] is False and r[2] is True  # nothing registered yet; then attempts to wait for
    assert (r[3], r[5], r[7], r[8]) == ("old", "a", None, False)  # "b" failed: passed over; no seal yet
    assert (r[10], r[12], r[13]) == ("c", None, True)  # the seal's producers, "later" not among them
    assert "took rows from producer attempt a of exchange 'live'" in r[14], r[14]
    assert (r[15], r[16]) == (None, True)  # every producer of the state read once


def test_live_producers_pass_over_an_attempt_that_failed_before_giving_rows_only(jvm):
    clean, gave_rows = jvm([
        live(0, update(described(1, [("x", "running")], [], [])), step("next"), step("dropped", "x", 0), step("next"),
             update(described(1, [("x", "failed"), ("y", "finished")], ["y"], [1])), step("next"),
             step("finished", "y", 3), step("complete"), step("not_committed"), step("dropped", "y", 0)),
        live(0, update(described(1, [("x", "running")], [], [])), step("finished", "x", 4),
             step("dropped", "x", 0)),
    ])
    assert clean["results"] == [None, "x", True, None, None, "y", None, True, None, False]
    assert gave_rows["results"] == [None, None, False]  # it gave rows before it failed


def test_live_producers_fail_the_read_of_an_overwritten_or_aborted_exchange(jvm):
    overwritten, aborted = jvm([live(0, update(described(2, [], [], []))),
                                live(0, update(described(1, [], [], [], state="aborted")))])
    assert "overwritten" in overwritten["results"][0]["error"], overwritten
    assert "was aborted" in aborted["results"][0]["error"], aborted


# ------------------------------------------------------------------ write and read settings
def test_write_settings_layer_the_options_and_parse_their_values(jvm):
    """Later layers win, keys in any case (and a table property's ``option.`` prefix), values spelled loosely; a
    larger maxFrameSize allows larger buffers."""
    layered, last_wins, larger_frame = jvm([
        {"op": "write_settings", "checked": True, "layers": [
            {"partitioner": "hash", "keys": "a", "bufferSize": "64k"},  # a table property layer...
            {"option.Keys": " a , b ,", "NUMSUBPARTITIONS": "4", "partitionType": "pipelined_bounded",
             "sortBufferSize": "1g", "buffersPerPartition": "3", "bufferTimeout": "250ms", "compression": " ZSTD "}]},
        {"op": "write_settings", "layers": [{"partitioner": "Broadcast", "bufferSize": "1"}, {"bufferSize": "2k"}]},
        {"op": "write_settings", "layers": [{"bufferSize": "40m", "maxFrameSize": "128m"}]},
    ])
    assert {k: layered["settings"][k] for k in ("partitioner", "keys", "numSubpartitions", "partitionType",
                                               "bufferSize", "sortBufferSize", "buffers", "bufferTimeoutNanos",
                                               "compression", "single")} == \
        {"partitioner": "hash", "keys": ["a", "b"], "numSubpartitions": 4, "partitionType": "PIPELINED_BOUNDED",
         "bufferSize": 64 << 10, "sortBufferSize": 1 << 30, "buffers": 3, "bufferTimeoutNanos": 250_000_000,
         "compression": "zstd", "single": False}
    assert (last_wins["settings"]["bufferSize"], last_wins["settings"]["partitioner"]) == (2048, "broadcast")
    assert last_wins["settings"]["single"]
    assert larger_frame["settings"]["bufferSize"] == 40 << 20  # a buffer may be half a frame


BAD_WRITE_SETTINGS = [  # (option layers, checked too, what the refusal says)
    ([{"numSubpartitions": "0"}], False, "numSubpartitions must be a positive integer, got '0'"),
    ([{"numSubpartitions": "four"}], False, "numSubpartitions must be a positive integer, got 'four'"),
    ([{"buffersPerPartition": "-1"}], False, "buffersPerPartition must be a positive integer, got '-1'"),
    ([{"bufferSize": "1x"}], False, "bufferSize: not a size: '1x'"),
    ([{"bufferSize": "0"}], False, "bufferSize must be at least 1 byte and at most 2147483647, got '0'"),
    ([{"bufferSize": "1.5m"}], False, "bufferSize: not a size: '1.5m'"),
    ([{"bufferSize": "40m"}], False, "bufferSize 41943040 must be at most half of maxFrameSize 67108864"),
    ([{"bufferSize": "40m", "maxFrameSize": "64m"}], False, "must be at most half of maxFrameSize"),
    ([{"bufferTimeout": "soon"}], False, "bufferTimeout: not a duration: 'soon'"),
    ([{"bufferTimeout": "5d"}], False, "bufferTimeout: not a duration: '5d'"),
    ([{"compression": "snappy"}], False, "unknown compression 'snappy'; use one of none, zstd, lz4"),
    ([{"partitioner": "custom", "keys": "k"}], True, "partitioner 'custom' is not written by the JVM writer"),
    ([{"partitioner": "rescale"}], True, "partitioner 'rescale' is not written by the JVM writer"),
    ([{"keys": "k", "partitionType": "fast"}], True, "unknown partitionType 'FAST'; use one of"),
    ([{"keys": " , "}], True, "the hash partitioner needs the 'keys' option"),
    ([{"partitioner": "broadcast", "partitionType": "PIPELINED_BOUNDED"}], True,
     "broadcast with partitionType PIPELINED_BOUNDED needs numSubpartitions"),
]


def test_a_bad_write_setting_is_refused_naming_its_key_and_value(jvm):
    answers = jvm([{"op": "write_settings", "layers": layers, "checked": checked}
                   for layers, checked, _ in BAD_WRITE_SETTINGS])
    wrong = [(layers, words, answer) for (layers, _, words), answer in zip(BAD_WRITE_SETTINGS, answers)
             if not (answer.get("error", "").startswith("IllegalArgumentException: ") and words in answer["error"])]
    assert wrong == []


def read_partitions(n: int, requested: str | None, **kw) -> dict:
    return {"op": "read_partitions", "exchange": "ex", "n": n, "requested": requested, **kw}


def test_read_partitions_group_subpartitions_as_asked_or_are_refused_saying_what_to_give(jvm):
    answers = jvm([
        read_partitions(8, "4", key_grouped=True), read_partitions(8, " 3 "), read_partitions(8, "4", kept=[1, 5]),
        read_partitions(4, "4"), read_partitions(4, "2", broadcast=True), read_partitions(4, "3", broadcast=True,
                                                                                           shared=True),
        read_partitions(8, "3", key_grouped=True), read_partitions(8, "9"), read_partitions(8, "0"),
        read_partitions(8, "many"), read_partitions(4, "5", broadcast=True), read_partitions(4, "x", broadcast=True),
    ])
    planned = [a.get("partitions", a.get("error")) for a in answers]
    assert planned[:6] == [[[0, 4], [1, 5], [2, 6], [3, 7]], [[0, 3, 6], [1, 4, 7], [2, 5]],
                           [[], [1, 5], [], []], [[0], [1], [2], [3]], [[0], [1]], [[0], [0], [0]]]
    assert [p.split(": ", 1)[1] for p in planned[6:]] == [
        "readPartitions=3 for exchange 'ex' of 8 subpartitions: give a divisor of 8 (each read partition then holds "
        "whole buckets)",
        "readPartitions=9 for exchange 'ex' of 8 subpartitions: give a number from 1 to 8",
        "readPartitions=0 for exchange 'ex' of 8 subpartitions: give a number from 1 to 8",
        "readPartitions of exchange 'ex' must be auto or a number of read partitions, got 'many'",
        "readPartitions=5 for broadcast exchange 'ex' of 4 copies: give a number from 1 to 4 (each read partition "
        "reads one copy)",
        "readPartitions of exchange 'ex' must be auto or a number of read partitions, got 'x'",
    ]



def test_a_read_planned_while_written_is_laid_out_to_the_task_slots_a_number_still_wins(jvm):
    """While written, auto lays the read out to the task slots: a key-grouped read in the largest divisor of n within
    them (200 into 3 slots: 2; into 8: 8), any other read in min(slots, n); a number given is taken as asked, and a
    sealed exchange's auto (no sizes known here) is one read partition per subpartition."""
    answers = jvm([
        read_partitions(200, None, key_grouped=True, live=True, slots=3),
        read_partitions(200, "auto", key_grouped=True, live=True, slots=8),
        read_partitions(7, None, key_grouped=True, live=True, slots=2),
        read_partitions(7, None, live=True, slots=2), read_partitions(4, None, live=True, slots=16),
        read_partitions(8, "4", key_grouped=True, live=True, slots=2),
        read_partitions(8, None, key_grouped=True, live=False, slots=2),
    ])
    planned = [a.get("partitions", a.get("error")) for a in answers]
    assert planned[0] == [list(range(0, 200, 2)), list(range(1, 200, 2))]
    assert planned[1] == [list(range(j, 200, 8)) for j in range(8)]
    assert planned[2] == [list(range(7))]  # 7 is prime: one key-grouped partition
    assert planned[3] == [[0, 2, 4, 6], [1, 3, 5]]
    assert planned[4] == [[0], [1], [2], [3]]
    assert planned[5] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert planned[6] == [[i] for i in range(8)]

# ------------------------------------------------------------------ which path a read or write takes
ROUTES = [  # (options, a write, why the Python source serves it: None for the JVM path)
    ({"exchange": "x"}, False, None),
    ({"EXCHANGE": "x", "readPartitions": "4", "declareTimeout": "10s"}, False, None),
    ({}, False, "no exchange option"),
    ({"exchange": ""}, False, "no exchange option"),
    ({"exchange": "x", "coordinator": "127.0.0.1:1"}, False, "option coordinator"),
    ({"exchange": "x", "numSubpartitions": "4"}, False, "option numsubpartitions"),  # a write's option on a read
    ({"exchange": "x", "numSubpartitions": "4"}, True, None),
    ({"exchange": "x", "NumSubpartitions": "4", "partitioner": "BROADCAST", "partitionType": "BLOCKING",
      "bufferSize": "1m", "sortBufferSize": "8m", "buffersPerPartition": "4", "bufferTimeout": "1s",
      "compression": "lz4", "keys": "k"}, True, None),
    ({"exchange": "x", "numSubpartitions": "4", "partitioner": "forward"}, True, None),
    ({"exchange": "x", "numSubpartitions": "4", "partitioner": "rebalance"}, True, None),
    ({"exchange": "x"}, True, "no numSubpartitions"),  # the Python writer's coalesced layout
    ({"exchange": "x", "numSubpartitions": "4", "partitioner": "rescale"}, True, "partitioner rescale"),
    ({"exchange": "x", "numSubpartitions": "4", "partitioner": "Custom"}, True, "partitioner custom"),
    ({"exchange": "x", "numSubpartitions": "4", "readPartitions": "2"}, True, "option readpartitions"),
    ({"exchange": "x", "numSubpartitions": "4", "secret": "s"}, True, "option secret"),
    ({"numSubpartitions": "4"}, True, "no exchange option"),
]


def test_route_sends_the_options_the_jvm_serves_to_it_and_names_the_first_it_does_not(jvm):
    answers = jvm([{"op": "route", "options": options, "write": write} for options, write, _ in ROUTES])
    assert [a.get("python_only", a.get("error")) for a in answers] == [why for _, _, why in ROUTES]


def exchange(partitioner: str = "hash", state: str = "committed", sealed: bool = True, width: int | None = 4,
             coalesce: bool = False, committed: tuple[str, ...] = ("finished",)) -> dict:
    """A coordinator description of a written exchange: its layout and its committed producers' states."""
    return {"name": "ex", "epoch": 1, "state": state, "sealed": sealed, "schema": "", "num_subpartitions": width,
            "coalesce": coalesce, "partition_type": "HYBRID", "partitioner": {"name": partitioner, "keys": ["k"]},
            "producers": [{"partition": f"p{i}", "index": i, "state": st, "location": {}}
                          for i, st in enumerate(committed)],
            "committed": [f"p{i}" for i in range(len(committed))], "seal_ends": [len(committed)] if sealed else [],
            "readable": verdict("ex", state, sealed, width, list(committed))}


READABLE = [  # (description, read while written, why the JVM reader does not read it: None when it does)
    (exchange(), False, None),
    (exchange("rebalance"), False, None),
    (exchange(state="open", sealed=False, committed=()), True, None),  # format("pipelined") reads it as it goes
    (None, False, "not declared"),
    (exchange("broadcast"), False, "partitioner broadcast"),  # the Python reader's layout
    (exchange(coalesce=True), False, "written without numSubpartitions"),
    (exchange("forward"), False, "forward partitioner"),
    (exchange(state="aborted", sealed=False), True, "was aborted"),
    (exchange(state="open", sealed=False), False, "is still being written"),
    (exchange(width=None), False, "does not know its number of subpartitions"),
    (exchange(committed=("finished", "running")), False, "committed producer 1 (partition p1) is running"),
]


def test_route_reads_in_the_jvm_what_its_reader_reads_as_the_python_reader_does(jvm):
    answers = jvm([{"op": "readable", "description": d, "while_written": w} for d, w, _ in READABLE])
    found = [a.get("unreadable", a.get("error")) for a in answers]
    assert [f if f is None or why is None else why if why in f else f for f, (_, _, why) in zip(found, READABLE)] == \
        [why for _, _, why in READABLE]


def test_real_time_mode_is_refused_where_spark_lacks_its_interface_naming_the_spark_it_needs(jvm):
    """This Spark (4.3) has Real-time Mode's source interface; one without it (an interface name it lacks stands for
    an older Spark's classpath) is told which Spark Real-time Mode needs, and its streams run in micro-batches."""
    here, older = jvm([{"op": "real_time", "interface": "org.apache.spark.sql.connector.read.streaming."
                                                        "SupportsRealTimeMode"},
                       {"op": "real_time", "interface": "org.apache.spark.sql.connector.read.streaming.Missing"}])
    assert here["unavailable"] is None
    assert older["unavailable"].startswith("Real-time Mode (trigger(realTime=...)) needs Spark 4.3 or later, whose "
                                           "org.apache.spark.sql.connector.read.streaming.Missing this Spark (4.")
    assert older["unavailable"].endswith("lacks; its stream queries read in micro-batches")


# ------------------------------------------------------------------ pruning subpartitions by a filter on the keys
ARROW_TYPES = {"int": pa.int32(), "long": pa.int64(), "string": pa.string(), "double": pa.float64()}


def written_to(columns: list[tuple[str, str]], keys: list[str], values: dict[str, list], n: int) -> list[int]:
    """The subpartitions the Python writer puts rows of every combination of ``values`` (key -> its values) in."""
    combos = list(itertools.product(*(values[k] for k in keys)))
    schema = pa.schema([(name, ARROW_TYPES[t]) for name, t in columns if name in keys])
    batch = pa.RecordBatch.from_pydict({k: [c[i] for c in combos] for i, k in enumerate(keys)}, schema)
    return sorted(set(HashSelector(keys, n).select(batch).tolist()))


KEY_FILTERS = [  # (columns, keys, predicates [op, column, values, literal type, literal first], the key values kept)
    ([("k", "long"), ("v", "string")], ["k"], [["=", "k", [5]]], {"k": [5]}),
    ([("k", "long")], ["k"], [["=", "k", [5], None, True]], {"k": [5]}),  # 5 = k
    ([("k", "long")], ["k"], [["<=>", "k", [-7]]], {"k": [-7]}),
    ([("k", "int")], ["k"], [["IN", "k", [1, 2, 3, 100, 2**31 - 1]]], {"k": [1, 2, 3, 100, 2**31 - 1]}),
    ([("k", "string")], ["k"], [["IN", "k", ["a", "bb", "é", ""]]], {"k": ["a", "bb", "é", ""]}),
    ([("k", "int")], ["k"], [["IN", "k", [1, 2, 3]], ["IN", "k", [2, 3, 4]]], {"k": [2, 3]}),  # both hold
    ([("a", "int"), ("b", "string")], ["a", "b"], [["=", "a", [3]], ["IN", "b", ["x", "y"]]],
     {"a": [3], "b": ["x", "y"]}),
    # no pruning: a key not bounded, another type's literal, floating point, not an equality, only a null, too many
    ([("a", "int"), ("b", "string")], ["a", "b"], [["=", "a", [3]]], None),
    ([("k", "int")], ["k"], [["=", "k", [5], "long"]], None),
    ([("k", "double")], ["k"], [["=", "k", [1.0]]], None),
    ([("k", "long")], ["k"], [["<", "k", [5]]], None),
    ([("k", "long")], ["k"], [["=", "k", [None]]], None),
    ([("a", "int"), ("b", "int")], ["a", "b"], [["IN", "a", list(range(65))], ["IN", "b", list(range(65))]], None),
]


def test_key_filter_keeps_exactly_the_subpartitions_the_python_writer_put_the_keys_in(jvm):
    cases = [(n, case) for n in (8, 13) for case in KEY_FILTERS]
    answers = jvm([{"op": "key_filter", "columns": columns, "keys": keys, "n": n, "predicates": predicates}
                   for n, (columns, keys, predicates, _) in cases])
    for (n, (columns, keys, predicates, values)), answer in zip(cases, answers):
        expected = None if values is None else written_to(columns, keys, values, n)
        got = answer.get("filter", answer)
        assert got["subpartitions"] == expected, (n, predicates, answer)
        if values is not None:  # Spark is told the predicates a pruning used (it still applies them)
            assert got["used"] == len(predicates), (n, predicates, answer)


# ------------------------------------------------------------------ the packages' layers
PACKAGES = Path(__file__).resolve().parent.parent / "jvm-stub/src/main/java/org/sparkflow/exchange"
# package -> its row ("" is the plugin's own package): a package names only packages of lower rows, so the Spark
# adapters (format, catalog) stand on the stream source and sink (stream), those on the client (read, write), the
# client on the coordinator's model and the wire
LAYERS = {"format": 8, "catalog": 7, "stream": 6, "read": 5, "write": 5, "coordinator": 4, "discovery": 3, "wire": 2,
          "errors": 1, "codec": 1, "functions": 1, "": 1, "contract": 0}
NAMED = re.compile(r"org\.sparkflow\.exchange\.(?:([a-z]+)\.)?[A-Z]")  # an import, or a class named in full


def test_the_jars_packages_name_only_packages_below_them():
    unknown, upward = set(), []
    for path in sorted(PACKAGES.rglob("*.java")):
        relative = path.relative_to(PACKAGES)
        package = relative.parts[0] if len(relative.parts) > 1 else ""
        if package not in LAYERS:
            unknown.add(package)
            continue
        for used in sorted(set(NAMED.findall(path.read_text(encoding="utf-8"))) - {package}):
            if used in LAYERS and LAYERS[used] >= LAYERS[package]:
                upward.append(f"{relative} names {used or 'the plugin package'}")
    assert not unknown, f"packages without a row in LAYERS (say which packages they stand on): {sorted(unknown)}"
    assert upward == []


def test_the_jars_classes_concatenate_strings_without_invokedynamic(jar):
    """A JVM's first write runs many concatenations once each; an invokedynamic site's first run builds method
    handles (classes spun and compiled), a StringBuilder's does not: the build compiles them inline."""
    with zipfile.ZipFile(jar) as archive:
        classes = [n for n in archive.namelist() if n.endswith(".class")]
        spun = [n for n in classes if b"java/lang/invoke/StringConcatFactory" in archive.read(n)]
    assert len(classes) > 100
    assert spun == []


def test_the_layer_check_finds_an_import_and_a_class_named_in_full():
    text = "import org.sparkflow.exchange.catalog.ExchangeTable;\n x = org.sparkflow.exchange.ExchangePlugin.y();"
    assert NAMED.findall(text) == ["catalog", ""]


def test_the_write_warmup_runs_the_writer_path_to_the_end(jvm):
    """A session runs the warm-up on a daemon thread that swallows its failures (it is only a speed-up): here a
    failure shows, so a change to the writer that breaks it cannot go unnoticed."""
    [answer] = jvm([{"op": "warmup"}])
    assert "error" not in answer, answer
    assert answer["rows"] == 20_000 + 100_000  # every row it made came out of a buffer
    # through a writer's own row method into 200 targets: 20,000 rows in 8 KiB buffers (vectors grow past their
    # first 32 rows), then 100,000 in 1.5 KiB ones (at most 18 of these rows), each target's rest at the end: more
    # buffers than the optimising compiler's 5,000 calls, so it compiles their encoding; timed flushes (as many as
    # the machine's pace makes) add buffers of fewer rows, never empty ones
    assert 100_000 // 18 <= answer["buffers"] <= 120_000, answer


@pytest.mark.parametrize("epoch", [0, 7, 2**40 + 3])
def test_the_jvm_sinks_epoch_marker_is_the_one_the_python_reader_expects(jvm, epoch):
    from sparkflow_exchange.buffer_kinds import epoch_marker

    assert jvm([{"op": "epoch_marker", "epoch": epoch}])[0]["hex"] == epoch_marker(epoch).hex()


def test_a_stream_offset_of_either_route_is_read_by_the_jvm_source(jvm):
    python_offset = {"epochs": {"s": 5}, "group": "g"}  # what the Python source writes to its checkpoint
    real_time = {"epochs": {"s": 4}, "group": "query-1",
                 "subpartitions": {"0": {"epoch": 5, "rows": {"0": 12, "1": 3}}, "1": {"epoch": 6, "rows": {}}}}
    # where each producer task's read goes on: buffer seq of that attempt, after its rows before it
    resumable = {"epochs": {"s": 4}, "group": "query-1",
                 "subpartitions": {"0": {"epoch": 5, "rows": {"0": 12, "1": 3},
                                         "buffers": {"0": {"attempt": "p-a0", "seq": 2, "rows": 10},
                                                     "1": {"attempt": "p-a1", "seq": 1, "rows": 3}}}}}
    broken = json.loads(json.dumps(resumable))  # a place that cannot be one is left out: read from the start
    broken["subpartitions"]["0"]["buffers"]["1"] = {"attempt": "p-a1", "seq": -4, "rows": 3}
    answers = jvm([{"op": "stream_offset", "stream": "s", "json": json.dumps(o)}
                   for o in (python_offset, real_time, resumable, broken)]
                  + [{"op": "stream_offset", "stream": "other", "json": json.dumps(python_offset)}])
    assert json.loads(answers[0]["json"]) == python_offset
    assert json.loads(answers[1]["json"]) == real_time
    assert json.loads(answers[2]["json"]) == resumable
    kept = json.loads(answers[3]["json"])["subpartitions"]["0"]["buffers"]
    assert kept == {"0": {"attempt": "p-a0", "seq": 2, "rows": 10}}
    assert "not one of exchange 'other'" in answers[4]["error"]


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_a_buffer_encoded_on_an_interrupted_thread_holds_every_row(jvm, compression):
    """A stream writer's flush runs while its task may be interrupted: the buffer must come out whole (an
    interruptible channel once failed it after its rows had left the vectors, and the rows were lost)."""
    from sparkflow_exchange.buffer import decode

    answers = jvm([{"op": "encode_rows", "rows": n, "compression": compression, "interrupted": interrupted}
                   for n, interrupted in ((1000, True), (1, True), (1000, False))])
    schema = pa.schema([("l", pa.int64())])
    got = [decode(bytes.fromhex(a["hex"]), schema).column(0).to_pylist() if "hex" in a else a for a in answers]
    assert got == [list(range(1000)), [0], list(range(1000))]


KEY_TYPES = ["bigint", "int", "smallint", "tinyint", "date", "timestamp", "timestamp_ntz"]


@pytest.mark.parametrize("types", [[t] for t in KEY_TYPES] + [["bigint", "int"], ["date", "tinyint", "timestamp"],
                                                              ["string"], ["bigint", "double"]])
def test_the_writer_routes_every_row_where_sparks_hash_partitioning_puts_it(jvm, types):
    """Keys of ints and longs are hashed by the writer itself: each row, nulls and both ends of the type's range
    among them, lands in the target of Spark's own pmod(murmur3_hash(keys, 42), n); other keys keep Spark's
    expression."""
    answer, = jvm([{"op": "route_keys", "types": types, "rows": 3000, "width": 7}])
    routed = answer["routed"]
    assert routed == {"rows": 3000, "differ": 0, "targets": 7,
                      "direct": all(t in KEY_TYPES for t in types)}


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_fixed_width_columns_come_out_of_the_writer_as_the_rows_held_them(jvm, compression):
    """Longs, ints, shorts, bytes, doubles, floats, dates, timestamps, decimals that fit a long and strings (empty
    and multi-byte ones among them, nulls between and after values) are stored straight into the vectors' memory:
    every value, null and bound of its range comes back as written, past the vectors' first growth (32 rows)."""
    import decimal

    from sparkflow_exchange.buffer import decode

    types = ["bigint", "int", "smallint", "tinyint", "double", "float", "date", "timestamp", "decimal(15,2)",
             "decimal(18,0)", "string"]
    answer, = jvm([{"op": "encode_typed", "types": types, "rows": 1000, "compression": compression}])
    schema = pa.schema([(f"c{i}", t) for i, t in enumerate(
        [pa.int64(), pa.int32(), pa.int16(), pa.int8(), pa.float64(), pa.float32(), pa.date32(),
         pa.timestamp("us", tz="UTC"), pa.decimal128(15, 2), pa.decimal128(18, 0), pa.string()])])
    got = decode(bytes.fromhex(answer["hex"]), schema)
    nulls = 0
    for i, column in enumerate(got.columns):
        if types[i] in ("date", "timestamp"):  # days and microseconds since the epoch, beyond Python's datetimes
            column = column.cast(pa.int32() if types[i] == "date" else pa.int64())
        for row, value in enumerate(column.to_pylist()):
            want = answer["values"][row][i]
            if want is None:
                nulls += 1
                assert value is None, (types[i], row)
                continue
            if types[i] == "double":
                assert value == float(want), (types[i], row)
            elif types[i] == "float":  # Java's shortest text of the float names the same float32
                assert np.float32(value) == np.float32(float(want)), (types[i], row)
            elif types[i].startswith("decimal"):
                assert value == decimal.Decimal(want), (types[i], row)
            elif types[i] == "string":
                assert value == want
            else:
                assert value == int(want), (types[i], row)
    assert got.num_rows == 1000 and 0 < nulls < 1000 * len(types)
    strings = [row[types.index("string")] for row in answer["values"]]
    assert "" in strings and any(s and "\u20ac" in s for s in strings)  # empty and multi-byte values were written


def _split_mix64(x: int) -> int:
    """WriteProbe.splitMix64: well-mixed (incompressible) longs both languages compute."""
    m = (1 << 64) - 1
    z = x * 0x9E3779B97F4A7C15 & m
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9 & m
    z = (z ^ z >> 27) * 0x94D049BB133111EB & m
    z ^= z >> 31
    return z - (1 << 64) if z >> 63 else z


def test_the_jvm_zstd_codecs_keep_one_context_and_write_and_read_arrows_frames(jvm):
    """The writer's ZSTD codec keeps one native context for all its buffers: buffer after buffer, of every size and
    kind (empty, a validity bitmap, counting longs, strings, incompressible, a megabyte), its frames are byte for byte
    those of Arrow's own codec at the same level and decompress to the buffer; closed, it compresses no more. A
    reader's codec keeps one context too and reads Arrow's frames back exactly."""
    rng = np.random.default_rng(7)
    buffers = [b"", b"\x01", b"\xff" * 32, np.arange(250, dtype="<i8").tobytes(),
               b"".join(f"{i:x>16}".encode() for i in range(250)), rng.bytes(100_000),
               np.arange(131_072, dtype="<i8").tobytes(), b"\xff" * 32, np.arange(250, dtype="<i8").tobytes()]
    answer = jvm([{"op": "zstd_context", "buffers": [b.hex() for b in buffers], "cut": 6}])[0]
    assert "error" not in answer, answer
    assert answer["kept"] == answer["arrow"]
    assert [bytes.fromhex(h) for h in answer["round_trip"]] == buffers
    compressed = [int.from_bytes(bytes.fromhex(h)[:8], "little", signed=True) for h in answer["kept"]]
    assert compressed[5] == -1 and compressed[6] == len(buffers[6])  # noise stored as it is; a megabyte compressed
    assert "closed" in answer["closed"].lower(), answer["closed"]
    # a reader's codec keeps one decompression context for all its buffers: Arrow's frames come back whole, a cut
    # frame is refused naming it, and a closed reader's codec decompresses no more
    assert [bytes.fromhex(h) for h in answer["read_back"]] == buffers
    assert answer["corrupt"] and "cannot decompress a ZSTD buffer" in answer["corrupt"], answer["corrupt"]
    assert answer["read_closed"] and "closed" in answer["read_closed"], answer["read_closed"]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_the_jvm_writer_skips_compressing_a_column_that_did_not_shrink_then_tries_again(jvm, compression):
    """The contract's compression.retry_after, as the Python writer follows it: a buffer position that saved too
    little is stored as it is, untried, for the next retry_after batches of the writer; a column that still does not
    shrink is skipped again; one that does is compressed from then on; a small buffer starts no skipping. A batch
    none of whose buffers would be compressed goes as an uncompressed IPC message; the validity buffer of a column
    without nulls goes empty (as Arrow C++ sends it), so it keeps no batch compressed. Every buffer holds its rows
    exactly."""
    from sparkflow_exchange.buffer import RETRY_AFTER, SKIP_MIN_BYTES, compressed_buffers, decode, is_compressed, verify

    rows = 2000
    kinds = ["noise"] * (RETRY_AFTER + 2) + ["count"] * (RETRY_AFTER + 2)
    answer = jvm([{"op": "encode_batches", "compression": compression, "batches": [[k, rows] for k in kinds]}])[0]
    schema = pa.schema([("l", pa.int64())])
    data_sizes, compressed, stored = [], [], []
    for index, (kind, hexed) in enumerate(zip(kinds, answer["hex"])):
        payload = bytes.fromhex(hexed)
        want = [_split_mix64(1_000_003 * index + i) for i in range(rows)] if kind == "noise" else list(range(rows))
        assert decode(payload, schema).column(0).to_pylist() == want, index
        message = verify(payload)
        compressed.append(is_compressed(message))
        *validity, data = compressed_buffers(message)
        assert [size for _, size in validity] == ([0] if compressed[-1] else []), index  # no nulls: empty
        data_sizes.append(data[1])
        stored.append(data[0])
    r = RETRY_AFTER
    # tried at 0 and r + 1 (noise: stored as they are), untried in between and for the r count batches after;
    # tried again at 2r + 2, where the counting column shrinks, and compressed from then on
    assert data_sizes == [-1] * (2 * r + 2) + [8 * rows] * 2, data_sizes
    data_attempts = [after - before for before, after in zip([0] + answer["attempts"], answer["attempts"])]
    assert [i for i, a in enumerate(data_attempts) if a] == [0, r + 1, 2 * r + 2, 2 * r + 3], data_attempts
    # the untried batches are uncompressed messages: their column's bytes as they are, without a length prefix
    assert [i for i, c in enumerate(compressed) if c] == [0, r + 1, 2 * r + 2, 2 * r + 3], compressed
    assert [n for n, c in zip(stored, compressed) if not c] == [8 * rows] * (2 * r), stored
    # a buffer under compression.skip_min_bytes that did not shrink starts no skipping: the next one is tried
    small = SKIP_MIN_BYTES // 8 - 1
    answer = jvm([{"op": "encode_batches", "compression": compression, "batches": [["noise", small], ["count", rows]]}])[0]
    buffers = [compressed_buffers(verify(bytes.fromhex(h)))[1] for h in answer["hex"]]
    assert [size for _, size in buffers] == [-1, 8 * rows], buffers
    assert decode(bytes.fromhex(answer["hex"][1]), schema).column(0).to_pylist() == list(range(rows))


def test_the_jvm_asks_for_a_subpartition_as_python_does_a_resumed_one_included(jvm):
    """The JVM reader's partition requests are byte for byte Python's, the resumed one (``resume_at``) too; after a
    resume it takes buffers from that sequence number on and refuses an earlier or a later one."""
    from sparkflow_exchange.network.protocol import PartitionRequest

    def response(seq: int) -> str:
        return encode_bytes(BufferResponse(1, seq, 0, DATA, 0, b"rows")).hex()

    answers = jvm([
        {"op": "partition_request", "partition": "p-1", "subpartition": 3, "receiver": 1, "credit": 4},
        {"op": "partition_request", "partition": "p-1", "subpartition": 3, "receiver": 1, "credit": 4,
         "resume_at": 17, "buffers": [response(17), response(18), response(18), response(20)]},
        {"op": "partition_request", "partition": "p-1", "subpartition": 3, "receiver": 1, "credit": 4,
         "resume_at": 0, "buffers": [response(1)]},
        {"op": "partition_request", "partition": "p-1", "subpartition": 3, "receiver": 1, "credit": 4,
         "resume_at": -1},
    ])
    assert answers[0]["hex"] == encode_bytes(PartitionRequest("p-1", 3, 1, 4)).hex()
    assert answers[1]["hex"] == encode_bytes(PartitionRequest("p-1", 3, 1, 4, resume_at=17)).hex()
    decoded = FrameDecoder().feed(bytes.fromhex(answers[1]["hex"]))
    assert decoded == [PartitionRequest("p-1", 3, 1, 4, 0, False, None, 17)]
    assert answers[1]["buffers"][:2] == [17, 18]
    assert "buffer 18 arrived where buffer 19 was due" in answers[1]["buffers"][2]  # duplicated
    assert "buffer 20 arrived where buffer 19 was due" in answers[1]["buffers"][3]  # lost
    assert "buffer 1 arrived where buffer 0 was due" in answers[2]["buffers"][0]
    assert answers[3]["error"] == "IllegalArgumentException: a resume position is a buffer sequence number, not -1"


def test_a_real_time_read_task_goes_on_at_the_buffer_the_last_one_stopped_at(jvm, tmp_service):
    """Real-time Mode ends its read tasks at every batch's end; the next task starts from the offset. It asks the
    producer attempt's service for the buffer holding its next row, not the epoch again from its start: every row
    once, and only the buffers from there are sent. An offset naming another attempt (a retry, a replay), a place
    the service does not hold, or none (an older checkpoint), reads the attempt from its start, skipping the rows
    taken: the same rows."""
    from harness import client_config

    from sparkflow_exchange import exchange as ex
    from sparkflow_exchange.buffer import schema_to_b64
    from sparkflow_exchange.spark import streaming as st

    svc = tmp_service()
    schema = pa.schema([("id", pa.int64())])
    cfg = client_config(svc, exchange="rt", numSubpartitions=1, partitioner="rebalance", bufferSize=1024,
                        compression="none")
    handle = st.declare_stream(cfg, schema)
    task = ex.ProducerTask(st.begin_epoch(handle, 0, "writer"), 0, "0-0-0")
    task.write([pa.record_batch([pa.array(range(i, i + 100), pa.int64())], schema=schema) for i in range(0, 1000, 100)])
    pid = task.finish()["partition"]  # the epoch stays open: the reader reads it as it is written

    def part() -> dict:
        [p] = [p for p in svc.status()["partitions"] if p["partition"] == pid]
        return p

    entries = part()["buffers"] + 1  # its data buffers, then the end event
    assert entries > 6, "small buffers: a resume must be able to skip some"

    def read(offset: dict, rows: int) -> tuple[list[int], dict, int]:
        before = part()["buffers_read"]
        [answer] = jvm([{"op": "real_time_read", "stream": "rt", "schema": schema_to_b64(schema),
                         "offset": json.dumps(offset), "rows": rows, "coordinator": svc.tcp, "secret": svc.secret,
                         "host_id": "", "timeout_ms": 60_000}])
        assert "error" not in answer, answer
        return answer["ids"], json.loads(answer["offset"]), part()["buffers_read"] - before

    first, offset, _ = read({"epochs": {"rt": -1}, "group": "g"}, 350)
    assert first == list(range(350))
    place = offset["subpartitions"]["0"]
    assert place["epoch"] == 0 and place["rows"] == {"0": 350}
    at = place["buffers"]["0"]
    assert at["attempt"] == pid and 0 < at["rows"] < 350 and at["seq"] >= 1

    rest, after, sent = read(offset, 650)
    assert rest == list(range(350, 1000))
    assert sent <= entries - at["seq"], f"{sent} buffers sent of {entries}: the task should resume at {at['seq']}"
    assert after["subpartitions"]["0"]["rows"] == {"0": 1000}

    def variant(change) -> dict:
        o = json.loads(json.dumps(offset))
        change(o["subpartitions"]["0"])
        return o

    for name, o in [("another attempt", variant(lambda p: p["buffers"]["0"].update(attempt="an-earlier-attempt"))),
                    ("beyond what the service holds", variant(lambda p: p["buffers"]["0"].update(seq=10**9))),
                    ("no place (an older checkpoint)", variant(lambda p: p.pop("buffers")))]:
        again, _, sent = read(o, 650)
        assert again == list(range(350, 1000)), name
        assert sent >= entries - 1, f"{name}: read from the start, {sent} buffers sent of {entries}"


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_buffers_compressed_on_the_push_thread_are_the_ones_the_task_thread_makes(jvm, compression):
    """A writer's buffers detached from its vectors and compressed on its background push thread come out byte for
    byte as the task's own thread encodes them, in the order they were handed over: the stored-as-is rule and the
    skipping of a column that did not shrink (whose state runs from buffer to buffer) hold there too."""
    from sparkflow_exchange.buffer import RETRY_AFTER

    kinds = ["noise"] * (RETRY_AFTER + 2) + ["count"] * (RETRY_AFTER + 2)
    batches = [[k, 2000] for k in kinds]
    inline, background = jvm([{"op": "encode_batches", "compression": compression, "batches": batches},
                              {"op": "encode_batches", "compression": compression, "batches": batches,
                               "background": True, "max_bytes": 40_000}])
    assert background["hex"] == inline["hex"]
    assert background["subpartitions"] == list(range(len(kinds)))
    assert background["threads"] == ["sparkflow-exchange-push-probe"] != [background["caller"]]
    assert background["ended"] is True


def test_the_push_thread_pushes_buffers_in_the_order_they_were_handed_over(jvm):
    answer, = jvm([{"op": "push_stage", "scenario": "order"}])
    assert answer["pushed"] == list(range(200))
    assert answer["subpartitions"] == [i % 7 for i in range(200)]
    assert answer["threads"] == ["sparkflow-exchange-push-probe"]
    assert (answer["encoded"], answer["discarded"], answer["ended"], answer["threads_alive"]) == (200, 0, True, 0)


def test_a_full_push_queue_holds_the_task_back_until_buffers_leave(jvm):
    """Bounded by bytes: with 300 bytes queued (the buffer being pushed counted) the task's fourth 100-byte buffer
    waits; it goes on once the sink takes buffers again. A buffer larger than the whole queue is still taken alone."""
    answer, = jvm([{"op": "push_stage", "scenario": "backpressure"}])
    assert (answer["task_waited"], answer["waited_after"], answer["queued_bytes_while_waiting"],
            answer["pushed_while_waiting"]) == (True, 3, 300, 0)
    assert answer["task_done"] is True
    assert answer["pushed"] == list(range(7))
    assert (answer["encoded"], answer["discarded"], answer["ended"], answer["threads_alive"]) == (7, 0, True, 0)


def test_a_failed_background_push_surfaces_on_the_task_thread_with_its_own_message(jvm):
    """The push thread's failure is thrown by the task's next call as it was thrown (the same exception); the
    buffers queued behind it are given back, never pushed out of order, and the thread ends."""
    answer, = jvm([{"op": "push_stage", "scenario": "failure"}])
    assert answer["drain"] == "exchange service refused buffer 2"
    assert answer["same_exception"] is True
    assert answer["later_submit"] == "exchange service refused buffer 2"
    assert answer["pushed"] == [0, 1]
    assert (answer["encoded"], answer["discarded"], answer["ended"], answer["threads_alive"]) == (3, 4, True, 0)


def test_stopping_the_push_thread_drops_the_queue_and_leaves_no_thread(jvm):
    """Abort and close stop the stage: the queued buffers are given back at once; a push held in the sink (waiting
    for credit) ends when its connection is closed under it; nothing is taken afterwards; no thread is left."""
    answer, = jvm([{"op": "push_stage", "scenario": "stop"}])
    assert answer["sink_entered"] is True
    assert answer["discarded_at_stop"] == 3
    assert answer["ended_while_held"] is False
    assert answer["ended"] is True
    assert answer["later_submit"] == "the connection was closed"  # refused, saying what ended the push
    assert answer["pushed"] == []
    assert (answer["encoded"], answer["discarded"], answer["threads_alive"]) == (1, 4, 0)


def test_a_stream_mixing_compressed_and_uncompressed_messages_reads_back_exactly_everywhere(jvm, tmp_service):
    """A compressed exchange's writer sends batches with nothing to compress as uncompressed messages: the service
    holds both kinds in one subpartition (in memory and in its spill file, sized by what each message holds), and the
    Python reader and the jar's reader (a producer on another host, over TCP) read every row, in order."""
    from harness import client_config

    from sparkflow_exchange.buffer import RETRY_AFTER, is_compressed, verify
    from sparkflow_exchange.calls import call
    from sparkflow_exchange.client import exchange_config
    from sparkflow_exchange.exchange import ProducerTask, declare_write, describe_exchange, read_subpartition
    from sparkflow_exchange.write_handle import commit_write

    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    rng = np.random.default_rng(11)
    rows = 4096

    def batch(i: int) -> pa.RecordBatch:  # runs of random ids, then counting ids and rounded prices: they shrink
        compressible = i // (RETRY_AFTER + 2) % 2 == 1
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64) if compressible else \
            rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
        return pa.record_batch([pa.array(ids), pa.array(np.round(ids % 1000 * 0.25, 2) if compressible
                                                        else rng.random(rows))], schema=schema)

    batches = [batch(i) for i in range(4 * (RETRY_AFTER + 2))]
    svc = tmp_service(host_id="hostA", conf={"memory.budget": "256k"})  # most buffers go to the spill file
    settings = dict(partitioner="rebalance", numSubpartitions=1, bufferSize=f"{16 * rows}", compression="zstd")
    config = client_config(svc, exchange="mixed", hostId="hostA", **settings)
    handle = declare_write(config, schema, overwrite=True)
    task = ProducerTask(handle, 0, "a0")
    task.write(batches)
    result = task.finish()
    commit_write(handle, [result["partition"]], {result["partition"]: result["rows"]})
    [part] = [p for p in svc.status()["partitions"] if p["exchange"] == "mixed"]
    assert part["spill_bytes"] > 0 and part["spill_path"], part
    data = Path(part["spill_path"]).read_bytes()
    index = Path(part["spill_path"]).with_suffix(".index")
    messages = [verify(data[offset:offset + length]) for _seq, offset, length, kind, _flags
                in spill.read_index(index, 0, data_size=len(data)) if kind == BufferKind.DATA]
    kinds = [is_compressed(m) for m in messages]
    assert True in kinds and False in kinds, kinds  # both kinds in the one subpartition
    expected = pa.Table.from_batches(batches)
    # uncompressed messages are counted at their size: the raw bytes are the Arrow bytes, the stored ones fewer
    assert expected.nbytes <= part["raw_bytes"] <= expected.nbytes * 1.05 and part["bytes"] < part["raw_bytes"], part
    for host in ("hostA", "hostB"):  # the spill file read in place, and over TCP
        reader = client_config(svc, exchange="mixed", hostId=host, **settings)
        got = pa.Table.from_batches(list(read_subpartition(reader, describe_exchange(reader), 0)), schema=schema)
        assert got.equals(expected), host
    desc = call(exchange_config("mixed", coordinator=svc.tcp, secret=svc.secret), "get_exchange", name="mixed")
    [producer] = desc["producers"]
    answer, = jvm([{"op": "remote_read", "describe": json.dumps(desc), "partition": producer["partition"],
                    "subpartition": 0, "secret": svc.secret, "host_id": "client-host", "after": -1,
                    "mid": "/nonexistent/mid", "go": "/nonexistent/go"}])
    assert "error" not in answer, answer
    assert answer["values"] == expected.column("id").to_pylist()


@pytest.mark.parametrize("writer", ["jvm", "python"])
def test_the_jars_decoder_loads_compressed_and_uncompressed_messages_one_after_another(jvm, writer):
    """The jar's BufferDecoder loads a stream mixing compressed and uncompressed messages (each says which it is)
    into one root, as a read task does: every value and null as written, whichever message came before (a batch
    with nulls, then one without and an empty validity buffer). The batches are larger than the Python writer's
    smallest batch it compresses (``compression.min_batch_bytes``)."""
    from sparkflow_exchange.buffer import RETRY_AFTER, BatchEncoder, decode, is_compressed, schema_to_b64, verify

    rows = 4000
    if writer == "jvm":
        schema = pa.schema([("l", pa.int64())])
        kinds = ["noise"] * (RETRY_AFTER + 2) + ["count"] * 2
        payloads = [bytes.fromhex(h) for h in jvm([{"op": "encode_batches", "compression": "zstd",
                                                     "batches": [[k, rows] for k in kinds]}])[0]["hex"]]
    else:
        schema = pa.schema([("k", pa.int64()), ("x", pa.float64())])
        rng = np.random.default_rng(9)
        encoder = BatchEncoder(schema, "zstd")
        payloads = []
        for i in range(RETRY_AFTER + 4):
            keys = rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
            mask = np.arange(rows) % 7 == 0 if i == 3 else None  # nulls in one batch only
            payloads.append(encoder.encode(pa.record_batch([pa.array(keys, mask=mask), pa.array(rng.random(rows))],
                                                           schema=schema)).to_pybytes())
    kinds = [is_compressed(verify(p)) for p in payloads]
    assert True in kinds and False in kinds, kinds
    expected = [decode(p, schema) for p in payloads]
    answer, = jvm([{"op": "decode_buffers", "schema": schema_to_b64(schema), "hex": [p.hex() for p in payloads]}])
    assert "error" not in answer, answer
    for i, (got, want) in enumerate(zip(answer["buffers"], expected)):
        assert "error" not in got, (i, got)
        assert got["nulls"] == [c.null_count for c in want.columns], i
        for values, column in zip(got["columns"], want.columns):
            parse = float if pa.types.is_floating(column.type) else int
            assert [None if v is None else parse(v) for v in values] == column.to_pylist(), i
