package org.sparkflow.exchange.codec;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdCompressCtx;
import com.github.luben.zstd.ZstdDecompressCtx;
import com.github.luben.zstd.ZstdException;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.AbstractCompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;

/**
 * ZSTD with one native context kept for all of a writer's or a reader's buffers. Arrow's own codec calls
 * {@code ZSTD_compress} and {@code ZSTD_decompress}, which set up and free a whole context for every buffer; a
 * write hashed into many subpartitions compresses thousands of small column buffers, and its reader decompresses
 * as many, so that set-up was most of their time (measured: 200 buffers of 250 rows, 24 ms to compress with
 * Arrow's codec, 10.5 ms with a kept context; 10 KB frames decompressed in a third of the time or less).
 * The frames are the same standard ZSTD frames at the same level (every reader decompresses them as before).
 * A writer's ({@link #forWriting}, {@link Compressing}) only compresses and holds only a compression context; a
 * reader's ({@link #forReading}, {@link Decompressing}) only decompresses. Each is used by one thread at a time
 * (buffers are encoded or loaded one at a time); {@link #close} frees the context, after which it fails.
 */
abstract sealed class ZstdContextCodec extends AbstractCompressionCodec implements AutoCloseable
        permits ZstdContextCodec.Compressing, ZstdContextCodec.Decompressing {
    private boolean closed;

    private ZstdContextCodec() {}

    /** A writer's codec: compresses at {@code level}. */
    static Compressing forWriting(int level) {
        return new Compressing(level);
    }

    /** A reader's codec: decompresses. */
    static Decompressing forReading() {
        return new Decompressing();
    }

    @Override
    public CompressionUtil.CodecType getCodecType() {
        return CompressionUtil.CodecType.ZSTD;
    }

    /** Fails once the context is freed: {@code whose} names the codec's user ("writer's", "reader's"). */
    final void checkOpen(String whose, String why) {
        if (closed) {
            throw new IllegalStateException("the " + whose + " ZSTD codec is closed: " + why);
        }
    }

    /** Free the native context (idempotent). */
    @Override
    public final void close() {
        if (!closed) {
            closed = true;
            freeContext();
        }
    }

    abstract void freeContext();

    /** A writer's: compresses with one kept context, made with the codec. */
    static final class Compressing extends ZstdContextCodec {
        // made with the codec, not at its first buffer: a branch every writer took once (a null context) left the
        // JIT's code of the warm-up's writer (whose context was made) to be thrown away at each task's first buffer
        private final ZstdCompressCtx context;

        private Compressing(int level) {
            context = new ZstdCompressCtx().setLevel(level);
        }

        @Override
        protected ArrowBuf doCompress(BufferAllocator allocator, ArrowBuf uncompressed) {
            long size = uncompressed.writerIndex();
            long bound = Zstd.compressBound(size);
            if (size > Integer.MAX_VALUE || bound > Integer.MAX_VALUE - CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH) {
                throw new IllegalArgumentException("a column buffer of " + size + " bytes is too large to compress");
            }
            checkOpen("writer's", "its buffers were all encoded");
            ArrowBuf compressed = allocator.buffer(CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH + bound);
            try {
                int written = context.compressDirectByteBuffer(
                        compressed.nioBuffer(CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH, (int) bound), 0, (int) bound,
                        uncompressed.nioBuffer(0, (int) size), 0, (int) size);
                compressed.writerIndex(CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH + written);
                return compressed;
            } catch (RuntimeException e) {
                compressed.close();
                throw e;
            }
        }

        @Override
        protected ArrowBuf doDecompress(BufferAllocator allocator, ArrowBuf compressed) {
            throw new UnsupportedOperationException("a writer's ZSTD codec does not decompress");
        }

        @Override
        void freeContext() {
            context.close();
        }
    }

    /** A reader's: decompresses with one kept context, made with the codec. */
    static final class Decompressing extends ZstdContextCodec {
        private final ZstdDecompressCtx context = new ZstdDecompressCtx();

        private Decompressing() {}

        @Override
        protected ArrowBuf doCompress(BufferAllocator allocator, ArrowBuf uncompressed) {
            throw new UnsupportedOperationException("a reader's ZSTD codec does not compress");
        }

        @Override
        protected ArrowBuf doDecompress(BufferAllocator allocator, ArrowBuf compressed) {
            checkOpen("reader's", "its read ended");
            long length = readUncompressedLength(compressed);
            long stored = compressed.writerIndex() - CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
            if (length < 0 || length > Integer.MAX_VALUE || stored > Integer.MAX_VALUE) {
                throw new IllegalStateException("cannot decompress a ZSTD buffer of " + stored + " bytes whose "
                        + "header says " + length + " bytes");
            }
            ArrowBuf out = allocator.buffer(length);
            try {
                int n = context.decompressDirectByteBuffer(out.nioBuffer(0, (int) length), 0, (int) length,
                        compressed.nioBuffer(CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH, (int) stored), 0,
                        (int) stored);
                if (n != length) {
                    throw new IllegalStateException("cannot decompress a ZSTD buffer: " + n + " bytes where its "
                            + "header says " + length);
                }
            } catch (ZstdException e) {
                out.close();
                throw new IllegalStateException("cannot decompress a ZSTD buffer: " + e.getMessage(), e);
            } catch (RuntimeException e) {
                out.close();
                throw e;
            }
            out.writerIndex(length);
            return out;
        }

        @Override
        void freeContext() {
            context.close();
        }
    }
}
