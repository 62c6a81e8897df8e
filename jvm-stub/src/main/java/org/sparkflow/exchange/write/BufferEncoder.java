package org.sparkflow.exchange.write;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.WritableByteChannel;
import java.util.ArrayList;
import java.util.List;
import java.util.zip.CRC32C;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BufferLayout;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.TypeLayout;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.compression.CompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.arrow.vector.compression.NoCompressionCodec;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.arrow.vector.util.TransferPair;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.sparkflow.exchange.codec.Codecs;
import org.sparkflow.exchange.codec.StoredWhenLarger;
import org.sparkflow.exchange.contract.Contract;

/**
 * Rows into data buffers, the layout of {@code buffer.BatchEncoder}: one Arrow IPC
 * record-batch message (its body compressed per Arrow buffer by the codec, ZSTD or LZ4_FRAME, if any, unless none of
 * its buffers would shrink: then uncompressed) (no schema: the exchange carries it once), then an 8-byte trailer, the message's CRC32C
 * and its length (u32 each, big endian). Each target fills its own Arrow root through Spark's own ArrowWriter as
 * rows arrive (no row is copied to be held), made when the target gets its first row; a root's memory is given
 * back each time its buffer leaves, so what a task holds is what its targets hold, never each target's largest.
 */
final class BufferEncoder implements AutoCloseable {
    static final int TRAILER = Contract.Buffer.TRAILER_SIZE;

    /**
     * Rows a target's vectors are first made for. Arrow's default (3,970) made every target of a wide write hold
     * about 110 KiB before its rows came: a 200,000-row write to 2,000 subpartitions peaked at 541 MiB of Arrow
     * memory, 11 MiB from 32 rows (a write to 8 subpartitions: 8-11 MiB). A target that gets more grows by
     * doubling (Arrow's {@code setSafe}); a TPC-H producer writes as fast.
     */
    static final int INITIAL_ROWS = 32;
    private final Schema schema;
    private final StructType rowSchema;
    private final BufferAllocator allocator;
    private final VectorSchemaRoot[] roots;
    private final ArrowWriter[] writers;
    private final CompressionCodec codec;
    /**
     * buffer_kinds.FLAG_COMPRESSED: what the Python writer sets on a compressed exchange's buffers, the uncompressed
     * messages among them too (each message says whether it is compressed).
     */
    static final int FLAG_COMPRESSED = 1;

    /** {@code schema}: the exchange's Arrow schema; {@code rowSchema}: the rows' Spark schema (the same columns). */
    BufferEncoder(Schema schema, StructType rowSchema, int targets, CompressionCodec codec) {
        this.codec = codec;
        this.schema = schema;
        this.rowSchema = rowSchema;
        allocator = ArrowUtils.rootAllocator().newChildAllocator("sparkflow-exchange-writer", 0, Long.MAX_VALUE);
        roots = new VectorSchemaRoot[targets];
        writers = new ArrowWriter[targets];
    }

    /** The flags of every buffer this encoder makes. */
    int flags() {
        return codec.getCodecType() == CompressionUtil.CodecType.NO_COMPRESSION ? 0 : FLAG_COMPRESSED;
    }

    /** Append {@code row} to target {@code t}'s buffer. */
    void append(int t, InternalRow row) {
        ArrowWriter w = writers[t];
        if (w == null) {
            roots[t] = VectorSchemaRoot.create(schema, allocator);
            w = writers[t] = DecimalColumnWriter.create(roots[t], rowSchema, INITIAL_ROWS);
        }
        w.write(row);
    }

    /**
     * Target {@code t}'s rows as one data buffer, in order ({@code sizeHint}: about its bytes, unused: the vectors
     * say; {@code rows}: the rows appended to it, checked); then empty.
     */
    byte[] encode(int t, long sizeHint, long rows) {
        return detach(t, rows).encode();
    }

    /**
     * Target {@code t}'s rows ({@code rows} of them, checked) taken out of its vectors as they are (Arrow's transfer:
     * no copy), to be encoded by {@link Detached#encode} later, on any thread; the target is empty at once and takes
     * rows again. The codec keeps per-position state ({@link StoredWhenLarger}): detached buffers are encoded one at
     * a time, in the order they were detached.
     */
    Detached detach(int t, long rows) {
        ArrowWriter w = writers[t];
        VectorSchemaRoot root = roots[t];
        try {
            w.finish();
            if (root.getRowCount() != rows) { // the buffer must hold what its end counts will say
                throw new IllegalStateException("a buffer of target " + t + " holds " + root.getRowCount()
                        + " rows where " + rows + " were written to it (" + Thread.currentThread().getName() + ")");
            }
            List<FieldVector> moved = new ArrayList<>(root.getFieldVectors().size());
            try {
                for (FieldVector v : root.getFieldVectors()) {
                    TransferPair pair = v.getTransferPair(allocator);
                    pair.transfer();
                    moved.add((FieldVector) pair.getTo());
                }
            } catch (RuntimeException e) {
                moved.forEach(FieldVector::close);
                throw e;
            }
            return new Detached(new VectorSchemaRoot(root.getSchema().getFields(), moved, (int) rows));
        } finally {
            w.reset();
            root.clear(); // what was not moved goes back; the vectors grow again from their first rows
        }
    }

    /** One target's rows out of its vectors: encoded once, or discarded; its memory goes back either way. */
    final class Detached implements PushStage.Job {
        private final VectorSchemaRoot root;

        private Detached(VectorSchemaRoot root) {
            this.root = root;
        }

        /** The Arrow bytes held (what the queue of a background push counts). */
        long bytes() {
            long n = 0;
            for (FieldVector v : root.getFieldVectors()) {
                n += v.getBufferSize();
            }
            return n;
        }

        @Override
        public byte[] encode() {
            try {
                long size = bytes();
                Sink out = new Sink((int) Math.min(Integer.MAX_VALUE - 64, size + size / 8 + 4096));
                ArrowRecordBatch unloaded = null;
                if (codec instanceof StoredWhenLarger adaptive) {
                    unloaded = unload(root, adaptive);
                    if (unloaded == null) {
                        adaptive.nextBatch(); // Arrow's unloader compresses every buffer, from the first position
                    }
                }
                try (ArrowRecordBatch batch = unloaded != null ? unloaded
                        : new VectorUnloader(root, true, codec, true).getRecordBatch()) {
                    MessageSerializer.serialize(new WriteChannel(out), batch);
                }
                return out.sealed();
            } catch (IOException e) {
                throw new IllegalStateException("cannot serialise a record batch: " + e, e);
            } finally {
                root.close();
            }
        }

        @Override
        public void discard() {
            root.close();
        }
    }

    /**
     * {@code root}'s record batch for a compressing writer: an uncompressed message if none of its buffers would be
     * compressed ({@link StoredWhenLarger#storesAllRaw}: its buffers as they are, no length prefixes, no copies), else
     * compressed buffer by buffer. The validity buffer of a column without nulls goes empty, as the Python writer
     * (Arrow C++) sends it and the IPC format allows: Arrow Java's {@code VectorUnloader} sends its bitmap of ones,
     * which compresses, so every batch of an incompressible column would stay compressed. Null (Arrow's
     * {@code VectorUnloader} then) for a layout it does not know (buffers other than the type's own, e.g. views).
     */
    private ArrowRecordBatch unload(VectorSchemaRoot root, StoredWhenLarger codec) {
        List<ArrowFieldNode> nodes = new ArrayList<>();
        List<ArrowBuf> buffers = new ArrayList<>();
        for (FieldVector v : root.getFieldVectors()) {
            if (!append(v, nodes, buffers)) {
                return null;
            }
        }
        long[] sizes = new long[buffers.size()];
        for (int i = 0; i < sizes.length; i++) {
            sizes[i] = buffers.get(i).writerIndex();
        }
        boolean raw = codec.storesAllRaw(sizes);
        if (!raw) {
            codec.nextBatch(); // its positions count this batch's buffers from the first
        }
        List<ArrowBuf> stored = new ArrayList<>(buffers.size());
        try {
            for (ArrowBuf b : buffers) {
                b.getReferenceManager().retain(); // the batch releases what it holds; the codec, what it is given
                stored.add(raw ? b : codec.compress(allocator, b));
            }
        } catch (RuntimeException e) {
            stored.forEach(ArrowBuf::close);
            throw e;
        }
        return new ArrowRecordBatch(root.getRowCount(), nodes, stored, raw
                ? NoCompressionCodec.DEFAULT_BODY_COMPRESSION : CompressionUtil.createBodyCompression(codec), true, false);
    }

    /** {@code v}'s node and buffers (then its children's), as Arrow's VectorUnloader: whether its layout is known. */
    private boolean append(FieldVector v, List<ArrowFieldNode> nodes, List<ArrowBuf> buffers) {
        TypeLayout layout = TypeLayout.getTypeLayout(v.getField().getType());
        List<ArrowBuf> own = v.getFieldBuffers();
        if (!layout.isFixedBufferCount() || own.size() != layout.getBufferLayouts().size()) {
            return false;
        }
        int nulls = v.getNullCount();
        nodes.add(new ArrowFieldNode(v.getValueCount(), nulls));
        for (int i = 0; i < own.size(); i++) {
            boolean noNulls = i == 0 && nulls == 0 && layout.getBufferTypes().get(0) == BufferLayout.BufferType.VALIDITY;
            buffers.add(noNulls ? allocator.getEmpty() : own.get(i));
        }
        for (FieldVector child : v.getChildrenFromFields()) {
            if (!append(child, nodes, buffers)) {
                return false;
            }
        }
        return true;
    }

    /**
     * The serialised message, grown in place by its trailer (one copy out at the end). A channel of its own, not
     * {@code Channels.newChannel}'s: that one is interruptible, and an interrupt of the encoding thread closed it
     * mid-buffer (the rows were gone from the vectors then); memory is written whatever the thread's state.
     */
    private static final class Sink extends ByteArrayOutputStream implements WritableByteChannel {
        Sink(int capacity) {
            super(capacity);
        }

        @Override
        public int write(ByteBuffer src) {
            int n = src.remaining();
            ensureCapacity(count + n);
            src.get(buf, count, n);
            count += n;
            return n;
        }

        private void ensureCapacity(int size) {
            if (size > buf.length) {
                buf = java.util.Arrays.copyOf(buf, Math.max(size, buf.length * 2));
            }
        }

        @Override
        public boolean isOpen() {
            return true;
        }

        byte[] sealed() {
            int length = count;
            CRC32C crc = new CRC32C();
            crc.update(buf, 0, length);
            write(ByteBuffer.allocate(TRAILER).putInt((int) crc.getValue()).putInt(length).array(), 0, TRAILER);
            return buf.length == count ? buf : toByteArray();
        }
    }

    /** Give back the targets' memory and the codec's (its native context); after every detached buffer is done. */
    @Override
    public void close() {
        for (VectorSchemaRoot root : roots) {
            if (root != null) {
                root.close();
            }
        }
        Codecs.close(codec);
        allocator.close();
    }
}
