package org.sparkflow.exchange.read;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.ReadableByteChannel;
import java.util.zip.CRC32C;
import org.apache.arrow.flatbuf.MessageHeader;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageMetadataResult;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.sparkflow.exchange.codec.Codecs;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.wire.Frames;

/**
 * Data buffers into a {@link VectorSchemaRoot} ({@code buffer.py}): each is an Arrow IPC record-batch message
 * followed by an 8-byte trailer, the message's CRC32C and length (u32 each, big endian). The bytes are read once,
 * into Arrow memory; the checksum is checked before Arrow looks at them; the body is loaded without another copy
 * (compressed bodies are decompressed by {@link Codecs}: ZSTD and LZ4 frames, natively where lz4-java can).
 */
public final class BufferDecoder implements AutoCloseable {
    static final int TRAILER = Contract.Buffer.TRAILER_SIZE;
    private final BufferAllocator allocator;
    private final VectorSchemaRoot root;
    private final Codecs.Reading codecs; // one ZSTD context for all of this reader's buffers
    private final VectorLoader loader;

    public BufferDecoder(BufferAllocator allocator, VectorSchemaRoot root) {
        this.allocator = allocator;
        this.root = root;
        this.codecs = Codecs.forReading();
        this.loader = new VectorLoader(root, codecs);
    }

    /** Free the decompression context (idempotent); loading afterwards fails. */
    @Override
    public void close() {
        codecs.close();
    }

    /** Corrupt bytes: the buffer is not what its writer wrote. */
    public static final class CorruptBuffer extends Exception {
        CorruptBuffer(String message) {
            super(message);
        }
    }

    /** Load the buffer of {@code length} bytes at {@code offset} of {@code file} into the root; its row count. */
    public int load(FileChannel file, long offset, int length) throws IOException, CorruptBuffer {
        if (length < TRAILER) {
            throw new CorruptBuffer("a data buffer of " + length + " bytes is too short to hold its checksum");
        }
        try (ArrowBuf buf = allocator.buffer(length)) {
            ByteBuffer target = buf.nioBuffer(0, length);
            while (target.hasRemaining()) {
                int n = file.read(target, offset + target.position());
                if (n < 0) {
                    throw new IOException("the data file ends at byte " + (offset + target.position()) + ", "
                            + "inside a buffer of " + length + " bytes at " + offset + " (truncated)");
                }
            }
            return decode(buf, length);
        }
    }

    /** Load a buffer received whole (from a service) into the root; its row count. */
    public int load(byte[] payload) throws IOException, CorruptBuffer {
        if (payload.length < TRAILER) {
            throw new CorruptBuffer("a data buffer of " + payload.length + " bytes is too short to hold its checksum");
        }
        try (ArrowBuf buf = allocator.buffer(payload.length)) {
            buf.setBytes(0, payload);
            return decode(buf, payload.length);
        }
    }

    /**
     * Arrow memory for a data buffer of {@code length} bytes to be received into ({@link Frames.PayloadSink}): the
     * socket's bytes land where they are decoded, with no copy through a byte array.
     */
    public Frames.Landing landing(int length) {
        return new Landed(allocator.buffer(length), length);
    }

    /** Load a buffer received into a {@link #landing} into the root; its row count. The caller closes the landing. */
    public int load(Frames.Landing landed) throws IOException, CorruptBuffer {
        if (!(landed instanceof Landed ours)) {
            throw new IllegalArgumentException("a landing this decoder did not make");
        }
        if (ours.length < TRAILER) {
            throw new CorruptBuffer("a data buffer of " + ours.length + " bytes is too short to hold its checksum");
        }
        return decode(ours.buf, ours.length);
    }

    /** A data buffer's Arrow memory, received into. */
    private static final class Landed implements Frames.Landing {
        final ArrowBuf buf;
        final int length;

        Landed(ArrowBuf buf, int length) {
            this.buf = buf;
            this.length = length;
        }

        @Override
        public ByteBuffer bytes() {
            return buf.nioBuffer(0, length);
        }

        @Override
        public void close() {
            buf.close();
        }
    }

    private int decode(ArrowBuf buf, int length) throws IOException, CorruptBuffer {
        {
            int messageLength = length - TRAILER;
            ByteBuffer whole = buf.nioBuffer(0, length);
            long expected = Integer.toUnsignedLong(whole.getInt(messageLength));
            long stated = Integer.toUnsignedLong(whole.getInt(messageLength + 4));
            if (stated != messageLength) {
                throw new CorruptBuffer("a data buffer of " + messageLength + " bytes says it holds " + stated
                        + " (truncated or misframed)");
            }
            CRC32C crc = new CRC32C();
            crc.update(buf.nioBuffer(0, messageLength));
            if (crc.getValue() != expected) {
                throw new CorruptBuffer(String.format("checksum mismatch in a data buffer of %d bytes (CRC32C 0x%08x, "
                        + "written as 0x%08x)", messageLength, crc.getValue(), expected));
            }
            ReadChannel in = new ReadChannel(new Slice(buf.nioBuffer(0, messageLength)));
            MessageMetadataResult meta = MessageSerializer.readMessage(in);
            if (meta == null || meta.getMessage().headerType() != MessageHeader.RecordBatch) {
                throw new CorruptBuffer("a data buffer holds no Arrow record batch");
            }
            long bodyStart = in.bytesRead();
            long bodyLength = meta.getMessageBodyLength();
            if (bodyStart + bodyLength > messageLength) {
                throw new CorruptBuffer("a record batch's body of " + bodyLength + " bytes lies outside its buffer");
            }
            buf.getReferenceManager().retain(); // deserializeRecordBatch releases the body it is given
            try (ArrowRecordBatch batch = MessageSerializer.deserializeRecordBatch(meta, buf.slice(bodyStart, bodyLength))) {
                loader.load(batch);
            }
            return root.getRowCount();
        }
    }

    /** A ByteBuffer as a channel (Arrow's message reader reads from channels). */
    private static final class Slice implements ReadableByteChannel {
        private final ByteBuffer source;

        Slice(ByteBuffer source) {
            this.source = source;
        }

        @Override
        public int read(ByteBuffer dst) {
            if (!source.hasRemaining()) {
                return -1;
            }
            int n = Math.min(dst.remaining(), source.remaining());
            ByteBuffer part = source.slice(source.position(), n);
            dst.put(part);
            source.position(source.position() + n);
            return n;
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        @Override
        public void close() {}
    }
}
