"""The JVM's Arrow IPC body compression (jvm-stub/.../codec) and pyarrow's read each other's buffers.

A few lines of Java, run with the plugin jar and Spark's jars on the class path (no Spark application):
buffers the Python writer's ``BatchEncoder`` makes with zstd and lz4 load through the JVM reader's
``BufferDecoder``; record batches compressed with the JVM writer's codecs (``Codecs.forName``, what the writer's
``BufferEncoder`` unloads with) read in pyarrow. Several types, nulls, empty and incompressible columns, and batches
larger than one LZ4 block. The option's names agree with ``config.COMPRESSIONS`` and a bad one is refused.
"""
from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from sparkflow_exchange.buffer import MIN_SAVING_PERCENT, BatchEncoder, compressed_buffers
from sparkflow_exchange.config import COMPRESSIONS, ConfigError, ExchangeConfig

PROBE = """
import java.io.*;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.file.*;
import org.apache.arrow.memory.*;
import org.apache.arrow.vector.*;
import org.apache.arrow.vector.ipc.*;
import org.apache.arrow.vector.ipc.message.*;
import org.sparkflow.exchange.codec.Codecs;
import org.sparkflow.exchange.read.BufferDecoder;

public class Probe {
    public static void main(String[] a) throws Exception {
        try (BufferAllocator alloc = new RootAllocator()) {
            if (a[0].equals("check")) {
                try {
                    System.out.println("ok " + Codecs.checked(a[1]) + " " + String.join(",", Codecs.NAMES) + " "
                            + Codecs.DEFAULT);
                } catch (IllegalArgumentException e) {
                    System.out.println("refused " + e.getMessage());
                }
                return;
            }
            try (ArrowStreamReader in = new ArrowStreamReader(new FileInputStream(a[2]), alloc);
                 FileOutputStream fos = new FileOutputStream(a[3])) {
                VectorSchemaRoot root = in.getVectorSchemaRoot();
                WriteChannel out = new WriteChannel(Channels.newChannel(fos));
                MessageSerializer.serialize(out, root.getSchema());
                if (a[0].equals("compress")) { // the writer's unloading, buffer by buffer compressed
                    while (in.loadNextBatch()) {
                        try (ArrowRecordBatch batch = new VectorUnloader(root, true, Codecs.forName(a[1]), true)
                                .getRecordBatch()) {
                            MessageSerializer.serialize(out, batch);
                        }
                    }
                } else { // "decompress": length-prefixed data buffers (message + trailer) through the reader
                    DataInputStream buffers = new DataInputStream(new FileInputStream(a[1]));
                    BufferDecoder decoder = new BufferDecoder(alloc, root);
                    while (buffers.available() > 0) {
                        byte[] payload = new byte[buffers.readInt()];
                        buffers.readFully(payload);
                        decoder.load(payload);
                        try (ArrowRecordBatch batch = new VectorUnloader(root).getRecordBatch()) {
                            MessageSerializer.serialize(out, batch);
                        }
                    }
                    root.close();
                }
            }
        }
    }
}
"""


@pytest.fixture(scope="module")
def probe(jar, tmp_path_factory):
    from sparkflow_exchange.build_plugin import spark_jars

    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    work = tmp_path_factory.mktemp("jvm-codecs")
    (work / "Probe.java").write_text(PROBE)
    # Arrow maps its memory as direct ByteBuffers through java.nio's internals, as Spark's JVM options allow
    classpath = ":".join([str(jar), *(str(p) for p in spark_jars())])

    def run(*args: str) -> str:
        out = subprocess.run(["java", "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", classpath, str(work / "Probe.java"), *args],
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip()
    return run


def batches() -> list[pa.RecordBatch]:
    """Several types, nulls, an empty batch, a column that does not compress, columns of many LZ4 blocks."""
    rng = np.random.default_rng(7)
    n = 700_000
    big = pa.record_batch({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "qty": pa.array(rng.integers(1, 50, n).astype(np.int32)),
        "price": pa.array(np.round(rng.random(n) * 1000, 2)),
        "noise": pa.array(rng.integers(0, 2**63, n, dtype=np.int64)),  # incompressible: stored raw per buffer
        "flag": pa.array(rng.choice(["A", "N", "R"], n)),
        "comment": pa.array([None if i % 11 == 0 else f"carefully final deposits {i % 977}" for i in range(n)]),
        "ok": pa.array(rng.random(n) < 0.5),
        "day": pa.array(rng.integers(8000, 11000, n).astype(np.int32), pa.date32()),
        "amount": pa.array([None if i % 13 == 0 else i * 7 % 100003 for i in range(n)], pa.decimal128(12, 2)),
    })
    return [big.slice(0, 3), big, big.slice(0, 0), big.slice(5, 1000)]


def stream(schema: pa.Schema, parts: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema) as w:
        for b in parts:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_the_jvm_reads_buffers_the_python_writer_compressed(probe, tmp_path, codec):
    parts = batches()
    schema = parts[0].schema
    enc = BatchEncoder(schema, codec)
    payloads = [enc.encode(b).to_pybytes() for b in parts]
    raw = sum(b.nbytes for b in parts)
    assert sum(map(len, payloads)) < raw * 0.8  # really compressed (the noise column is not)
    (tmp_path / "buffers").write_bytes(b"".join(struct.pack(">i", len(p)) + p for p in payloads))
    (tmp_path / "schema").write_bytes(stream(schema, []))
    probe("decompress", str(tmp_path / "buffers"), str(tmp_path / "schema"), str(tmp_path / "out"))
    got = ipc.open_stream(pa.py_buffer((tmp_path / "out").read_bytes())).read_all()
    assert got.equals(pa.Table.from_batches(parts, schema))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_the_jvm_reads_a_compressed_exchanges_small_batches_the_python_writer_sent_uncompressed(probe, tmp_path,
                                                                                                 codec):
    """Batches under compression.min_batch_bytes (what a wide layout's producers send) go as uncompressed messages
    among compressed ones; the JVM reader's BufferDecoder loads both kinds in one stream."""
    from sparkflow_exchange.buffer import MIN_BATCH_BYTES, is_compressed, verify

    big = batches()[1]
    parts = [big.slice(i * 50, 50) for i in range(6)] + [big.slice(1000, 20_000), big.slice(400, 1)]
    schema = big.schema
    enc = BatchEncoder(schema, codec)
    payloads = [enc.encode(b).to_pybytes() for b in parts]
    kinds = [is_compressed(verify(p)) for p in payloads]
    assert kinds == [False] * 6 + [True, False], kinds
    assert all(len(p) < MIN_BATCH_BYTES for p, k in zip(payloads, kinds) if not k)
    (tmp_path / "buffers").write_bytes(b"".join(struct.pack(">i", len(p)) + p for p in payloads))
    (tmp_path / "schema").write_bytes(stream(schema, []))
    probe("decompress", str(tmp_path / "buffers"), str(tmp_path / "schema"), str(tmp_path / "out"))
    got = ipc.open_stream(pa.py_buffer((tmp_path / "out").read_bytes())).read_all()
    assert got.equals(pa.Table.from_batches(parts, schema))


@pytest.mark.parametrize("codec", ["zstd", "lz4", "none"])
def test_pyarrow_reads_batches_the_jvm_writer_compressed(probe, tmp_path, codec):
    parts = batches()
    schema = parts[0].schema
    (tmp_path / "in").write_bytes(stream(schema, parts))
    probe("compress", codec, str(tmp_path / "in"), str(tmp_path / "out"))
    data = (tmp_path / "out").read_bytes()
    got = ipc.open_stream(pa.py_buffer(data)).read_all()
    assert got.equals(pa.Table.from_batches(parts, schema))
    raw = sum(b.nbytes for b in parts)
    if codec == "none":
        assert len(data) >= raw
    else:  # the random column's data is stored as it is (length -1), as the Python writer stores it
        reader = ipc.MessageReader.open_stream(pa.py_buffer(data))
        reader.read_next_message()  # the schema
        messages = [reader.read_next_message() for _ in parts]
        big = compressed_buffers(messages[1].serialize())
        assert (8 + 8 * parts[1].num_rows, -1) in big, big
        assert all((stored - 8) * 100 <= size * (100 - MIN_SAVING_PERCENT) for stored, size in big if size != -1)
        assert len(data) < raw * 0.8
        # and Python's reader path (checksum trailer, read_record_batch) takes the JVM's messages as its own
        reader = ipc.open_stream(pa.py_buffer(data))
        assert reader.read_next_batch().num_rows == parts[0].num_rows


def test_the_jvm_and_python_agree_on_the_option_and_refuse_a_bad_value(probe):
    assert probe("check", "LZ4") == f"ok lz4 {','.join(COMPRESSIONS)} {ExchangeConfig().compression}"
    message = "unknown compression 'gzip'; use one of none, zstd, lz4"
    assert probe("check", "gzip") == f"refused {message}"
    with pytest.raises(ConfigError, match=message):
        ExchangeConfig.load({"compression": "gzip"}, spark_conf={})
