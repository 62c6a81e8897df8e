"""Compressed exchanges outside Spark: every Python writer with every Python reader, in memory and spilled.

A buffer that shrinks too little (``compression.min_saving_percent`` of the contract) is stored as it is, the IPC
format's per-buffer uncompressed length -1, so a reader pays no decompression for bytes that did not shrink; the
others stay compressed. Real services on loopback; a small memory budget forces the buffers into the spill file,
read through the local file channel (same host) and over TCP (another host id). The JVM writer and reader with
these buffers: tests/test_jvm_codecs.py (buffers) and tests/test_jvm_write.py (a Spark round trip on every path).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

import sparkflow_exchange as sfe
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.buffer import (
    MIN_SAVING_PERCENT,
    BatchEncoder,
    compressed_buffers,
    decode,
    is_compressed,
    raw_size,
    verify,
)
from sparkflow_exchange.service.metrics import render
from sparkflow_exchange.write_handle import commit_write

SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("noise", pa.int64()),
                    pa.field("text", pa.string()), pa.field("price", pa.float64())])
ROWS = 40_000
SUBS = 3


def batch(start: int, rows: int) -> pa.RecordBatch:
    """Keys and prices that compress, a string column that compresses well, a column of random bits that does not."""
    rng = np.random.default_rng(start)
    k = np.arange(start, start + rows, dtype=np.int64)
    return pa.record_batch([pa.array(k), pa.array(rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)),
                            pa.array([f"carefully final deposits {i % 97}" for i in range(start, start + rows)]),
                            pa.array(np.round(k % 1000 * 1.25, 2))], schema=SCHEMA)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_buffer_that_shrinks_too_little_is_stored_as_it_is_and_the_others_compressed(codec):
    b = batch(0, ROWS)
    encoder = BatchEncoder(SCHEMA, codec)
    payload = encoder.encode(b)
    buffers = compressed_buffers(verify(payload))
    assert (8 + 8 * ROWS, -1) in buffers  # the random column's data: its 8-byte prefix (-1) and its bytes
    assert sum(size != -1 for _, size in buffers) >= 2, buffers  # the text's bytes and the prices at least
    for stored, size in buffers:
        if size != -1:
            assert (stored - 8) * 100 <= size * (100 - MIN_SAVING_PERCENT), buffers
    assert decode(payload, SCHEMA).equals(b)
    slot = bytearray(4 << 20)  # the shared-memory path serialises in place: the same buffers
    offset, length = encoder.encode_into(b, memoryview(slot))
    assert bytes(slot[offset:offset + length]) == payload.to_pybytes()
    for part in (b.slice(0, 0), b.slice(7, 1), b.slice(100, 3000)):  # empty, one row, a slice's offsets
        assert decode(encoder.encode(part), SCHEMA).equals(part)
        # the size it would have uncompressed: Arrow's own uncompressed buffer, but for the compression's metadata
        plain = len(BatchEncoder(SCHEMA).encode(part))
        assert plain <= raw_size(encoder.encode(part)) <= plain + 64
    assert raw_size(b"not an arrow message") == len(b"not an arrow message")  # counted as it is, never a failure


def test_nothing_is_stored_compressed_when_nothing_shrinks():
    noise = pa.record_batch([pa.array(np.random.default_rng(3).integers(-2**63, 2**63 - 1, ROWS, dtype=np.int64))],
                            names=["noise"])
    for codec in ("lz4", "zstd"):
        message = verify(BatchEncoder(noise.schema, codec).encode(noise))
        assert [size for _, size in compressed_buffers(message)] == [-1]
        assert len(message) <= noise.nbytes + 512  # the raw bytes and the metadata: never larger than uncompressed


def _write_producer(config) -> None:
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    producer = ex.ProducerTask(handle, 0, "a0")
    producer.write([batch(s, 5000) for s in range(0, ROWS, 5000)])
    result = producer.finish()
    commit_write(handle, [result["partition"]], {result["partition"]: result["rows"]})


def _write_open_writer(config, settings: dict) -> None:
    with sfe.open_writer(config.exchange, SCHEMA, keys=["k"], num_subpartitions=SUBS, **settings) as w:
        for s in range(0, ROWS, 5000):
            w.write(batch(s, 5000))


@pytest.mark.parametrize("spilled", [False, True], ids=["default-budget", "small-budget"])
@pytest.mark.parametrize("writer", ["python", "open_writer"])
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_every_python_writer_and_reader_moves_compressed_exchanges_exactly(tmp_service, codec, writer, spilled):
    # 1 MiB of memory for 2.7 MB of Arrow: a HYBRID partition writes most of its buffers to its spill file
    svc = tmp_service(host_id="hostA", conf={"memory.budget": "1m"} if spilled else None)
    settings = dict(partitioner="hash", keys="k", numSubpartitions=SUBS, bufferSize="64k", compression=codec)
    name = f"z-{codec}-{writer}-{int(spilled)}"
    config = client_config(svc, exchange=name, hostId="hostA", **settings)
    if writer == "python":
        _write_producer(config)
    else:
        _write_open_writer(config, {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret,
                                    "hostId": "hostA", "bufferSize": "64k", "compression": codec})
    part = next(p for p in svc.status()["partitions"] if p["exchange"] == name)
    if spilled:
        assert part["spill_bytes"] > 0, part
    expected = pa.Table.from_batches([batch(s, 5000) for s in range(0, ROWS, 5000)]).sort_by("k")
    uncompressed = expected.nbytes
    assert part["bytes"] < 0.75 * uncompressed, (part["bytes"], uncompressed)  # held compressed
    # both sizes wherever sizes are shown: the partition's status, the exchange's summary, the metrics
    assert uncompressed <= part["raw_bytes"] <= uncompressed * 1.2, (part["raw_bytes"], uncompressed)
    summary = next(s for s in sfe.list_exchanges(coordinator=svc.tcp, secret=svc.secret) if s.name == name)
    assert (summary.bytes, summary.raw_bytes) == (part["bytes"], part["raw_bytes"]), summary
    assert summary.to_json()["raw_bytes"] == part["raw_bytes"]
    metrics = render(svc.status())
    assert f'sparkflow_partition_raw_bytes_total{{service="{svc.status()["service"]["service_id"]}",' \
           f'partition="{part["partition"]}",exchange="{name}"}} {part["raw_bytes"]}' in metrics
    for host in ("hostA", "hostB"):  # the local channel (spill file read in place), TCP from another host
        reader = client_config(svc, exchange=name, hostId=host, **settings)
        desc = ex.describe_exchange(reader)
        got = pa.Table.from_batches([b for s in range(SUBS) for b in ex.read_subpartition(reader, desc, s)],
                                    schema=SCHEMA)
        assert got.sort_by("k").equals(expected), host
        with sfe.open_reader(name, coordinator=svc.tcp, service=svc.tcp, secret=svc.secret, hostId=host) as r:
            assert r.read_all().sort_by("k").equals(expected), host


def test_a_column_that_did_not_shrink_is_tried_again_after_a_while():
    """Incompressible bytes cost no compression attempt on the next batches; the column is tried again later."""
    from sparkflow_exchange.buffer import RETRY_AFTER

    schema = pa.schema([pa.field("v", pa.int64(), nullable=False)])
    noise = pa.record_batch([pa.array(np.random.default_rng(5).integers(-2**63, 2**63 - 1, ROWS, dtype=np.int64))],
                            schema=schema)
    zeros = pa.record_batch([pa.array(np.zeros(ROWS, dtype=np.int64))], schema=schema)
    encoder = BatchEncoder(schema, "lz4")
    sizes, compressed = [], []
    for b in [noise] + [zeros] * (RETRY_AFTER + 1):
        payload = encoder.encode(b)
        assert decode(payload, schema).equals(b)
        sizes.append(compressed_buffers(verify(payload))[0][1])
        compressed.append(is_compressed(verify(payload)))
    assert sizes == [-1] * (RETRY_AFTER + 1) + [8 * ROWS], sizes  # stored as they are, then compressed again
    # nothing to compress while the column is skipped: uncompressed messages, the batch's own serialisation
    assert compressed == [True] + [False] * RETRY_AFTER + [True], compressed


NOISY = pa.schema([pa.field("k", pa.int64()), pa.field("x", pa.float64(), nullable=False),
                   pa.field("flag", pa.bool_())])


def noisy(start: int, rows: int, compressible: bool = False) -> pa.RecordBatch:
    """Random keys and doubles (nothing shrinks; ``compressible``: counting keys), a small boolean column."""
    rng = np.random.default_rng(start)
    keys = np.arange(start, start + rows, dtype=np.int64) if compressible else \
        rng.integers(-2**63, 2**63 - 1, rows, dtype=np.int64)
    return pa.record_batch([pa.array(keys), pa.array(rng.random(rows)),
                            pa.array(rng.random(rows) < 0.5)], schema=NOISY)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_batch_with_nothing_to_compress_goes_as_an_uncompressed_message(codec):
    """The contract's rule for a whole batch: once the positions of its large buffers are skipped (they did not
    shrink), a batch whose other buffers hold fewer than compression.skip_min_bytes goes as an uncompressed message
    (a column without nulls has an empty validity buffer; a small boolean column's saving does not matter); a batch
    whose skipping ran out, or with more bytes in positions not skipped, is a compressed message. Read back
    exactly, through the shared-memory path too."""
    from sparkflow_exchange.buffer import RETRY_AFTER, SKIP_MIN_BYTES

    rows = 8 * (SKIP_MIN_BYTES - 8)  # the boolean column's bits: under skip_min_bytes
    encoder = BatchEncoder(NOISY, codec)
    compressed = []
    for i in range(RETRY_AFTER + 3):
        b = noisy(i * rows, rows)
        payload = encoder.encode(b)
        assert decode(payload, NOISY).equals(b), i
        compressed.append(is_compressed(verify(payload)))
        if not compressed[-1]:
            assert verify(payload).to_pybytes() == b.serialize().to_pybytes(), i
            assert raw_size(payload) == len(payload), i  # the service counts it at its own size
    # tried at 0 (the keys and doubles are skipped from then on) and when the skipping ran out, at r + 1
    assert [i for i, c in enumerate(compressed) if c] == [0, RETRY_AFTER + 1], compressed
    slot = bytearray(4 << 20)
    b = noisy(99, rows)
    offset, length = encoder.encode_into(b, memoryview(slot))
    assert not is_compressed(verify(bytes(slot[offset:offset + length])))
    assert decode(bytes(slot[offset:offset + length]), NOISY).equals(b)
    # twice the rows, nulls among the keys: the keys' bitmap and the booleans, tried, are too many bytes to leave
    b = noisy(7, 2 * rows)
    nulls = pa.record_batch([pa.array(b[0].to_numpy(), mask=np.arange(2 * rows) % 50 == 0), b[1], b[2]],
                            schema=NOISY)
    payload = encoder.encode(nulls)
    assert is_compressed(verify(payload)) and decode(payload, NOISY).equals(nulls)
    assert compressed_buffers(verify(payload))[1] == (8 + 8 * 2 * rows, -1)  # the keys: still skipped


def test_a_compressed_exchange_is_read_in_as_many_partitions_as_the_same_rows_uncompressed(tmp_service):
    """Read layouts size by what a subpartition decodes to: a compressed exchange stores a fraction of its rows'
    bytes, and coalescing by those would pack its rows into a fraction of the read tasks (a query then runs on
    fewer cores, with larger partitions to sort and join)."""
    from sparkflow_exchange.consumer.read_plan import read_ranges

    svc = tmp_service(host_id="hostA")
    described = {}
    for codec in ("none", "zstd"):
        config = client_config(svc, exchange=f"layout-{codec}", hostId="hostA", partitioner="hash", keys="k",
                               bufferSize="64k", compression=codec)  # no width: the read may coalesce
        handle = ex.declare_write(config, SCHEMA, overwrite=True)
        producer = ex.ProducerTask(handle, 0, "a0", num_subpartitions=8)
        producer.write([batch(s, 5000) for s in range(0, ROWS, 5000)])
        result = producer.finish()
        commit_write(handle, [result["partition"]], {result["partition"]: result["rows"]})
        described[codec] = ex.describe_exchange(config)
    plain, packed = described["none"], described["zstd"]
    assert plain.coalesce and packed.coalesce and packed.sealed
    assert plain.subpartition_raw_bytes == plain.subpartition_bytes  # nothing compressed: the same sizes
    assert sum(packed.subpartition_bytes) < 0.75 * sum(plain.subpartition_bytes), (packed, plain)
    for stored, raw in zip(plain.subpartition_bytes, packed.subpartition_raw_bytes):  # within the framing
        assert abs(raw - stored) <= 0.05 * stored, (plain.subpartition_bytes, packed.subpartition_raw_bytes)
    advisory = sum(plain.subpartition_bytes) // 4
    assert len(read_ranges(packed, advisory)) == len(read_ranges(plain, advisory)) >= 4


WIDE = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("key", pa.int64(), nullable=False),
                  pa.field("s", pa.string(), nullable=False), pa.field("d", pa.float64(), nullable=False)])


def wide_rows(start: int, rows: int) -> pa.RecordBatch:
    """The wide benchmark's rows (benchmarks/wide_compression.py): counting ids and keys, padded strings, doubles."""
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.record_batch([pa.array(ids), pa.array(ids % 100_003), pa.array([f"{i:x>16}" for i in ids.tolist()]),
                            pa.array(np.random.default_rng(start).random(rows))], schema=WIDE)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_batch_under_min_batch_bytes_goes_uncompressed_untried(codec):
    """The contract's compression.min_batch_bytes (the Python writer's): a batch whose buffers hold fewer bytes
    together is the uncompressed exchange's buffer byte for byte, on the socket and the shared-memory path, and
    counts for no skipping; a batch of as many bytes or more is compressed. Every one reads back exactly, and the
    encoder says what each would take uncompressed."""
    from sparkflow_exchange.buffer import MIN_BATCH_BYTES, RETRY_AFTER
    from sparkflow_exchange.buffer_kinds import FLAG_COMPRESSED

    per_row = 8 + 8 + 4 + 16 + 8  # id, key, the string's offset and bytes, d
    small, large = wide_rows(0, MIN_BATCH_BYTES // per_row - 8), wide_rows(0, MIN_BATCH_BYTES // per_row + 8)
    assert sum(b.size for c in small.columns for b in c.buffers() if b is not None) < MIN_BATCH_BYTES
    encoder, plain = BatchEncoder(WIDE, codec), BatchEncoder(WIDE)
    for b in (small, small.slice(3, 40), wide_rows(5, 1)):
        payload = encoder.encode(b)
        assert payload.to_pybytes() == plain.encode(b).to_pybytes()
        assert not is_compressed(verify(payload)) and decode(payload, WIDE).equals(b)
        assert encoder.plain_bytes == len(payload) == raw_size(payload)
        assert encoder.last_flags == 0  # pushed as an uncompressed message: the service counts it at its size
        slot = bytearray(1 << 20)
        offset, length = encoder.encode_into(b, memoryview(slot))
        assert bytes(slot[offset:offset + length]) == payload.to_pybytes()
    payload = encoder.encode(large)
    assert is_compressed(verify(payload)) and decode(payload, WIDE).equals(large)
    assert encoder.last_flags == FLAG_COMPRESSED == encoder.flags
    assert len(payload) < 0.8 * len(plain.encode(large)) and encoder.plain_bytes == len(plain.encode(large))
    # small batches count for no skipping: a column that did not shrink stays skipped through any number of them
    schema = pa.schema([pa.field("v", pa.int64(), nullable=False)])
    noise = [pa.record_batch([pa.array(np.random.default_rng(i).integers(-2**63, 2**63 - 1, ROWS, dtype=np.int64))],
                             schema=schema) for i in range(2)]
    tiny = pa.record_batch([pa.array(np.zeros(100, dtype=np.int64))], schema=schema)
    encoder = BatchEncoder(schema, codec)
    assert is_compressed(verify(encoder.encode(noise[0])))  # tried: its one buffer did not shrink
    for _ in range(RETRY_AFTER + 1):
        assert not is_compressed(verify(encoder.encode(tiny)))
    assert not is_compressed(verify(encoder.encode(noise[1])))  # still skipped: untried, an uncompressed message


@pytest.mark.parametrize("spilled", [False, True], ids=["default-budget", "small-budget"])
def test_a_wide_exchange_of_small_batches_is_held_and_read_as_the_uncompressed_one(tmp_service, spilled):
    """Spark's default width in little: producers whose rows split into small batches per subpartition (packed in
    regions) write the default codec's exchange as the uncompressed one, byte for byte per subpartition; read
    exactly through the spill files (local file channel) and over TCP; a read layout sizes it as the uncompressed
    one. An exchange whose batches straddle min_batch_bytes (some compressed, some not) reports each subpartition's
    bytes as they would be uncompressed exactly: its layout is the uncompressed exchange's."""
    from sparkflow_exchange.consumer.read_plan import read_ranges

    svc = tmp_service(host_id="hostA", conf={"memory.budget": "1m"} if spilled else None)
    producers, width, rows = 6, 40, 4000  # 100 rows (4.4 KB) per subpartition and producer
    described, parts = {}, {}
    for codec, buffer_size, tag in (("none", "1m", "wide"), ("zstd", "1m", "wide"), ("none", "64k", "mixed"),
                                    ("zstd", "64k", "mixed")):
        name = f"{tag}-{codec}-{int(spilled)}"
        config = client_config(svc, exchange=name, hostId="hostA", partitioner="hash", keys="key",
                               bufferSize=buffer_size, compression=codec,  # no width: the read may coalesce
                               bufferTimeout="0")  # no timed flushes: both codecs' writers cut the same buffers
        handle = ex.declare_write(config, WIDE, overwrite=True)
        results = []
        for p in range(producers):
            producer = ex.ProducerTask(handle, p, f"a{p}", num_subpartitions=width if tag == "wide" else 4)
            producer.write([wide_rows(p * rows * 10 + s, 1000) for s in range(0, rows * (1 if tag == "wide" else 10),
                                                                               1000)])
            results.append(producer.finish())
        commit_write(handle, [r["partition"] for r in results], {r["partition"]: r["rows"] for r in results})
        described[(tag, codec)] = ex.describe_exchange(config)
        parts[(tag, codec)] = [p for p in svc.status()["partitions"] if p["exchange"] == name]
        if spilled:
            assert all(p["spill_bytes"] > 0 for p in parts[(tag, codec)])
        expected = pa.Table.from_batches([wide_rows(p * rows * 10 + s, 1000) for p in range(producers)
                                          for s in range(0, rows * (1 if tag == "wide" else 10), 1000)]).sort_by("id")
        for host in ("hostA", "hostB"):  # the spill files or memory in place, and TCP from another host
            reader = client_config(svc, exchange=name, hostId=host)
            desc = ex.describe_exchange(reader)
            got = pa.Table.from_batches([b for s in range(desc.num_subpartitions)
                                         for b in ex.read_subpartition(reader, desc, s)], schema=WIDE)
            assert got.sort_by("id").equals(expected), (name, host)
    plain, packed = described[("wide", "none")], described[("wide", "zstd")]
    assert packed.subpartition_bytes == plain.subpartition_bytes == packed.subpartition_raw_bytes
    # pushed unflagged (no message of theirs is compressed): the service counted them at their size, unparsed
    assert all(p["raw_bytes"] == p["bytes"] for p in parts[("wide", "zstd")])
    assert sorted(p["bytes"] for p in parts[("wide", "zstd")]) == sorted(p["bytes"] for p in parts[("wide", "none")])
    plain, mixed = described[("mixed", "none")], described[("mixed", "zstd")]
    assert sum(mixed.subpartition_bytes) < 0.9 * sum(plain.subpartition_bytes)  # its large batches compressed
    assert mixed.subpartition_raw_bytes == plain.subpartition_bytes
    for advisory in (sum(plain.subpartition_bytes) // k for k in (2, 3, 4)):
        assert read_ranges(mixed, advisory) == read_ranges(plain, advisory)
