package org.sparkflow.exchange.codec;

import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.CompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.sparkflow.exchange.contract.Contract;

/**
 * A codec whose buffers that shrink too little are stored as they are: the IPC format's per-buffer uncompressed
 * length -1, which every reader takes without decompressing. Arrow Java stores a buffer raw only when compressing
 * made it larger; this keeps a buffer compressed only if it saves at least {@code compression.min_saving_percent}
 * of the contract, as the Python writer does ({@code buffer.store_raw_where_larger}).
 */
final class StoredWhenLarger implements CompressionCodec {
    static final int MIN_SAVING_PERCENT = Contract.CompressionSaving.MIN_PERCENT;
    private final CompressionCodec codec;

    StoredWhenLarger(CompressionCodec codec) {
        this.codec = codec;
    }

    @Override
    public ArrowBuf compress(BufferAllocator allocator, ArrowBuf uncompressed) {
        long size = uncompressed.writerIndex();
        if (size == 0) {
            return codec.compress(allocator, uncompressed);
        }
        uncompressed.getReferenceManager().retain(); // the codec releases it; kept for a raw copy
        try {
            ArrowBuf compressed = codec.compress(allocator, uncompressed);
            long kept = compressed.writerIndex() - CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
            boolean raw = compressed.getLong(0) == CompressionUtil.NO_COMPRESSION_LENGTH;
            if (raw || kept * 100 <= size * (100 - MIN_SAVING_PERCENT)) {
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
}
