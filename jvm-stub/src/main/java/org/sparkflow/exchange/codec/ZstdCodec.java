package org.sparkflow.exchange.codec;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdCompressCtx;
import com.github.luben.zstd.ZstdDecompressCtx;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.AbstractCompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;

/**
 * Arrow's ZSTD IPC codec over zstd-jni with one compression and one decompression context per thread, reused.
 * Arrow Java's own ZSTD codec calls zstd's one-shot functions, which make and free a context for every buffer: on
 * the small buffers of a wide write (a few thousand rows per subpartition) that setup was most of zstd's cost
 * (TPC-H scale factor 5 Q9's write took 1.5x the CPU of an uncompressed one; with reused contexts about lz4's).
 * Frames are standard zstd frames, as pyarrow writes and reads them.
 */
final class ZstdCodec extends AbstractCompressionCodec {
    private static final long PREFIX = CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
    private static final ThreadLocal<ZstdCompressCtx> COMPRESS =
            ThreadLocal.withInitial(() -> new ZstdCompressCtx().setLevel(Codecs.ZSTD_LEVEL));
    private static final ThreadLocal<ZstdDecompressCtx> DECOMPRESS = ThreadLocal.withInitial(ZstdDecompressCtx::new);
    static final ZstdCodec INSTANCE = new ZstdCodec();

    private ZstdCodec() {}

    @Override
    protected ArrowBuf doCompress(BufferAllocator allocator, ArrowBuf uncompressed) {
        long n = uncompressed.writerIndex();
        long bound = Zstd.compressBound(n);
        if (PREFIX + bound > Integer.MAX_VALUE) {
            throw new IllegalStateException("a buffer of " + n + " bytes is too large to compress at once");
        }
        ArrowBuf out = allocator.buffer(PREFIX + bound);
        try {
            int size = COMPRESS.get().compressDirectByteBuffer(out.nioBuffer(0, (int) (PREFIX + bound)), (int) PREFIX,
                    (int) bound, uncompressed.nioBuffer(0, (int) n), 0, (int) n);
            out.writerIndex(PREFIX + size);
            return out;
        } catch (RuntimeException e) {
            out.close();
            throw e;
        }
    }

    @Override
    protected ArrowBuf doDecompress(BufferAllocator allocator, ArrowBuf compressed) {
        long total = readUncompressedLength(compressed);
        if (total > Integer.MAX_VALUE) {
            throw new IllegalStateException("a zstd frame says it holds " + total + " bytes (too many for one buffer)");
        }
        int size = (int) total;
        int end = (int) compressed.writerIndex();
        ArrowBuf out = allocator.buffer(Math.max(size, 1));
        try {
            int got;
            try {
                got = DECOMPRESS.get().decompressDirectByteBuffer(out.nioBuffer(0, size), 0, size,
                        compressed.nioBuffer(0, end), (int) PREFIX, end - (int) PREFIX);
            } catch (RuntimeException e) {
                throw new IllegalStateException("corrupt zstd frame in an Arrow buffer: " + e.getMessage(), e);
            }
            if (got != size) {
                throw new IllegalStateException("corrupt zstd frame in an Arrow buffer: it holds " + got
                        + " bytes, its buffer says " + size);
            }
            out.writerIndex(size);
            return out;
        } catch (RuntimeException e) {
            out.close();
            throw e;
        }
    }

    @Override
    public CompressionUtil.CodecType getCodecType() {
        return CompressionUtil.CodecType.ZSTD;
    }
}
