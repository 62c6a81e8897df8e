package org.sparkflow.exchange.codec;

import java.util.Arrays;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.CompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.sparkflow.exchange.contract.Contract;

/**
 * A writer's codec whose buffers that shrink too little are stored as they are: the IPC format's per-buffer
 * uncompressed length -1, which every reader takes without decompressing. Arrow Java stores a buffer raw only when
 * compressing made it larger; this keeps a buffer compressed only if it saves at least
 * {@code compression.min_saving_percent} of the contract, as the Python writer does.
 *
 * <p>It also skips what will not shrink, the rule of the Python writer ({@code buffer._BufferCompressor}) with the
 * contract's {@code compression.retry_after}: a buffer position of the record batch (one column's validity, offsets
 * or data buffer) that saved too little is stored as it is without being compressed for the next
 * {@link #RETRY_AFTER} record batches, then tried again, if it had at least {@link #SKIP_MIN_BYTES} (what a smaller
 * buffer saves is mostly the codec's framing, not the column's). An incompressible column costs one compression in
 * {@code RETRY_AFTER + 1}. A record batch none of whose buffers would be compressed goes as an uncompressed message
 * ({@link #storesAllRaw}: no length prefixes, no copies). The writer asks {@link #storesAllRaw}, then calls
 * {@link #nextBatch} before a compressed record batch's buffers (compressed in the batch's order); one instance per
 * writer, one thread at a time.
 */
public final class StoredWhenLarger implements CompressionCodec, AutoCloseable {
    static final int MIN_SAVING_PERCENT = Contract.CompressionSaving.MIN_PERCENT;
    /** Record batches a position that did not shrink is stored as it is, untried (the contract's). */
    public static final int RETRY_AFTER = Contract.CompressionSaving.RETRY_AFTER;
    /** Only a buffer of at least this many bytes starts the skipping: a smaller one's saving is mostly framing. */
    public static final int SKIP_MIN_BYTES = Contract.CompressionSaving.SKIP_MIN_BYTES;
    private final CompressionCodec codec;
    private int[] skip = new int[16];
    private int position;
    private long attempts;

    StoredWhenLarger(CompressionCodec codec) {
        this.codec = codec;
    }

    /** The next buffers are a new record batch's, from its first. */
    public void nextBatch() {
        position = 0;
    }

    /**
     * Whether a record batch of buffers of these sizes (one per position, in the batch's order) goes as an
     * uncompressed IPC message: some of its buffers' positions are being skipped and the others (empty ones aside)
     * hold fewer than {@link #SKIP_MIN_BYTES} together, too few for their saving to matter. If so, the skipped
     * positions count the batch as stored as it is (as {@link #compress} would have); if not, nothing changes and the
     * batch's buffers go through {@link #compress} after {@link #nextBatch}. The Python writer decides the same way
     * ({@code buffer._BufferCompressor.stores_all_raw}).
     */
    public boolean storesAllRaw(long[] sizes) {
        if (sizes.length > skip.length) {
            skip = Arrays.copyOf(skip, Math.max(sizes.length, 2 * skip.length));
        }
        boolean skipped = false;
        long rest = 0;
        for (int i = 0; i < sizes.length; i++) {
            if (sizes[i] > 0) {
                if (skip[i] > 0) {
                    skipped = true;
                } else {
                    rest += sizes[i];
                }
            }
        }
        if (!skipped || rest >= SKIP_MIN_BYTES) {
            return false;
        }
        for (int i = 0; i < sizes.length; i++) {
            if (sizes[i] > 0 && skip[i] > 0) {
                skip[i]--;
            }
        }
        return true;
    }

    /** Buffers compressed so far (those stored untried not counted): what the skipping saved is visible in tests. */
    public long attempts() {
        return attempts;
    }

    @Override
    public ArrowBuf compress(BufferAllocator allocator, ArrowBuf uncompressed) {
        int at = position++;
        long size = uncompressed.writerIndex();
        if (size == 0) {
            return codec.compress(allocator, uncompressed);
        }
        if (at >= skip.length) {
            skip = Arrays.copyOf(skip, Math.max(at + 1, 2 * skip.length));
        }
        if (skip[at] > 0) { // did not shrink lately: stored as it is, no compression tried
            skip[at]--;
            try {
                return CompressionUtil.packageRawBuffer(allocator, uncompressed);
            } finally {
                uncompressed.close();
            }
        }
        attempts++;
        uncompressed.getReferenceManager().retain(); // the codec releases it; kept for a raw copy
        try {
            ArrowBuf compressed = codec.compress(allocator, uncompressed);
            long kept = compressed.writerIndex() - CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
            boolean raw = compressed.getLong(0) == CompressionUtil.NO_COMPRESSION_LENGTH;
            if (!raw && kept * 100 <= size * (100 - MIN_SAVING_PERCENT)) {
                return compressed;
            }
            if (size >= SKIP_MIN_BYTES) {
                skip[at] = RETRY_AFTER;
            }
            if (raw) {
                return compressed;
            }
            compressed.close();
            return CompressionUtil.packageRawBuffer(allocator, uncompressed);
        } finally {
            uncompressed.close();
        }
    }

    @Override
    public ArrowBuf decompress(BufferAllocator allocator, ArrowBuf compressed) {
        return codec.decompress(allocator, compressed);
    }

    @Override
    public CompressionUtil.CodecType getCodecType() {
        return codec.getCodecType();
    }

    /** Free what the codec it wraps holds (a kept native context). */
    @Override
    public void close() {
        Codecs.close(codec);
    }
}
