package org.sparkflow.exchange.write;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.util.List;
import java.util.zip.CRC32C;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.util.ArrowUtils;

/**
 * Rows into data buffers, byte for byte the layout of {@code buffer.BatchEncoder} (uncompressed): one Arrow IPC
 * record-batch message (no schema: the exchange carries it once), then an 8-byte trailer, the message's CRC32C
 * and its length (u32 each, big endian). One Arrow root, refilled for each buffer by Spark's own ArrowWriter.
 */
final class BufferEncoder implements AutoCloseable {
    static final int TRAILER = 8;
    private final BufferAllocator allocator;
    private final VectorSchemaRoot root;
    private final ArrowWriter writer;

    BufferEncoder(Schema schema) {
        allocator = ArrowUtils.rootAllocator().newChildAllocator("sparkflow-exchange-writer", 0, Long.MAX_VALUE);
        root = VectorSchemaRoot.create(schema, allocator);
        writer = ArrowWriter.create(root);
    }

    /** The data buffer holding {@code rows}, in order. */
    byte[] encode(List<InternalRow> rows) {
        try {
            for (InternalRow row : rows) {
                writer.write(row);
            }
            writer.finish();
            Sink out = new Sink((int) Math.min(Integer.MAX_VALUE - 64, (long) root.getRowCount() * 16 + 4096));
            try (ArrowRecordBatch batch = new VectorUnloader(root).getRecordBatch()) {
                MessageSerializer.serialize(new WriteChannel(Channels.newChannel(out)), batch);
            }
            return out.sealed();
        } catch (IOException e) {
            throw new IllegalStateException("cannot serialise a record batch: " + e, e);
        } finally {
            writer.reset();
        }
    }

    /** The serialised message, grown in place by its trailer (one copy out at the end). */
    private static final class Sink extends ByteArrayOutputStream {
        Sink(int capacity) {
            super(capacity);
        }

        byte[] sealed() {
            int length = count;
            CRC32C crc = new CRC32C();
            crc.update(buf, 0, length);
            write(ByteBuffer.allocate(TRAILER).putInt((int) crc.getValue()).putInt(length).array(), 0, TRAILER);
            return toByteArray();
        }
    }

    @Override
    public void close() {
        root.close();
        allocator.close();
    }
}
