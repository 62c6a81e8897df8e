package org.sparkflow.exchange.codec;

import java.nio.ByteBuffer;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.AbstractCompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;
import net.jpountz.lz4.LZ4Compressor;
import net.jpountz.lz4.LZ4Exception;
import net.jpountz.lz4.LZ4Factory;
import net.jpountz.lz4.LZ4SafeDecompressor;
import net.jpountz.xxhash.XXHashFactory;

/**
 * Arrow's LZ4_FRAME IPC codec over lz4-java's native block compressor: each buffer is one LZ4 frame
 * (the format pyarrow writes and reads), after Arrow's 8-byte uncompressed length.
 *
 * <p>Written frames have independent 64 KiB blocks (the frame format's default block size, as pyarrow's) and no
 * checksums (the exchange's trailer checks every buffer). Frames are read whole, independent blocks natively;
 * pyarrow writes linked blocks (a match may reach into the previous 64 KiB), which lz4-java's decoders refuse, so
 * those decode here in Java into one array. An empty buffer is an empty frame (see {@link #compress}).
 */
public final class Lz4FrameCodec extends AbstractCompressionCodec {
    public static final Lz4FrameCodec INSTANCE = new Lz4FrameCodec();
    private static final int MAGIC = 0x184D2204;
    private static final int BLOCK = 64 << 10;
    private static final byte FLG = 0x60; // version 01, independent blocks, no checksums, no content size
    private static final byte BD = 0x40; // 64 KiB blocks
    private static final byte HC = (byte) (XXHashFactory.fastestInstance().hash32()
            .hash(new byte[] {FLG, BD}, 0, 2, 0) >>> 8);
    private static final int HEADER = 7;
    private static final long PREFIX = CompressionUtil.SIZE_OF_UNCOMPRESSED_LENGTH;
    private final LZ4Compressor compressor = LZ4Factory.fastestInstance().fastCompressor();
    private final LZ4SafeDecompressor decompressor = LZ4Factory.fastestInstance().safeDecompressor();

    private Lz4FrameCodec() {}

    /**
     * An empty buffer as its length (0) and an empty frame: Arrow Java writes the length alone, which pyarrow hands
     * to its LZ4 decoder as a frame ("less than one frame"); zstd takes empty input, LZ4 frames do not.
     */
    @Override
    public ArrowBuf compress(BufferAllocator allocator, ArrowBuf uncompressed) {
        if (uncompressed.writerIndex() != 0) {
            return super.compress(allocator, uncompressed);
        }
        ArrowBuf out = allocator.buffer(PREFIX + HEADER + 4);
        out.setLong(0, 0L);
        ByteBuffer dst = out.nioBuffer(0, (int) (PREFIX + HEADER + 4));
        header(dst, (int) PREFIX);
        dst.putInt((int) PREFIX + HEADER, 0);
        out.writerIndex(PREFIX + HEADER + 4);
        uncompressed.close();
        return out;
    }

    private static void header(ByteBuffer dst, int pos) {
        dst.putInt(pos, Integer.reverseBytes(MAGIC));
        dst.put(pos + 4, FLG).put(pos + 5, BD).put(pos + 6, HC);
    }

    @Override
    protected ArrowBuf doCompress(BufferAllocator allocator, ArrowBuf uncompressed) {
        long n = uncompressed.writerIndex();
        int blocks = (int) ((n + BLOCK - 1) / BLOCK);
        long max = PREFIX + HEADER + 4L * blocks + 4 + (long) blocks * compressor.maxCompressedLength(BLOCK);
        if (blocks == 1) {
            max = PREFIX + HEADER + 4 + compressor.maxCompressedLength((int) n) + 4;
        }
        ArrowBuf out = allocator.buffer(max);
        try {
            ByteBuffer src = uncompressed.nioBuffer(0, (int) n);
            ByteBuffer dst = out.nioBuffer(0, (int) max);
            int pos = (int) PREFIX;
            header(dst, pos);
            pos += HEADER;
            for (int off = 0; off < n; off += BLOCK) {
                int len = (int) Math.min(BLOCK, n - off);
                int c = compressor.compress(src, off, len, dst, pos + 4, (int) max - pos - 8);
                if (c >= len) { // stored: the high bit says the block is not compressed
                    dst.put(pos + 4, src.slice(off, len), 0, len);
                    dst.putInt(pos, Integer.reverseBytes(len | 0x80000000));
                    pos += 4 + len;
                } else {
                    dst.putInt(pos, Integer.reverseBytes(c));
                    pos += 4 + c;
                }
            }
            dst.putInt(pos, 0); // end mark
            out.writerIndex(pos + 4);
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
            throw new IllegalStateException("an LZ4 frame says it holds " + total + " bytes (too many for one buffer)");
        }
        int size = (int) total;
        int end = (int) compressed.writerIndex();
        ByteBuffer src = compressed.nioBuffer(0, end);
        ArrowBuf out = allocator.buffer(Math.max(size, 1));
        try {
            int pos = (int) PREFIX;
            if (end - pos < HEADER || Integer.reverseBytes(src.getInt(pos)) != MAGIC) {
                throw corrupt("no frame magic");
            }
            int flg = src.get(pos + 4) & 0xff;
            if ((flg >>> 6) != 1 || (flg & 1) != 0) {
                throw corrupt("frame version or dictionary not supported (FLG 0x" + Integer.toHexString(flg) + ")");
            }
            boolean independent = (flg & 0x20) != 0;
            boolean blockChecksum = (flg & 0x10) != 0;
            boolean contentSize = (flg & 0x08) != 0;
            pos += 6 + (contentSize ? 8 : 0) + 1;
            int written;
            if (independent) {
                written = independentBlocks(src, pos, end, out.nioBuffer(0, size), size, blockChecksum);
            } else {
                byte[] in = new byte[end - pos];
                src.get(pos, in);
                byte[] result = new byte[size];
                written = linkedBlocks(in, result, blockChecksum);
                out.setBytes(0, result);
            }
            if (written != size) {
                throw corrupt("it holds " + written + " bytes, its buffer says " + size);
            }
            out.writerIndex(size);
            return out;
        } catch (RuntimeException e) {
            out.close();
            throw e instanceof LZ4Exception || e instanceof IndexOutOfBoundsException
                    ? corrupt(e.getMessage()) : e;
        }
    }

    private int independentBlocks(ByteBuffer src, int pos, int end, ByteBuffer dst, int size, boolean checksum) {
        int dp = 0;
        while (true) {
            int word = Integer.reverseBytes(src.getInt(pos));
            pos += 4;
            if (word == 0) {
                return dp;
            }
            int len = word & 0x7fffffff;
            if (len > end - pos) {
                throw corrupt("a block of " + len + " bytes runs past the frame");
            }
            if (word < 0) {
                dst.put(dp, src, pos, len);
                dp += len;
            } else {
                dp += decompressor.decompress(src, pos, len, dst, dp, size - dp);
            }
            pos += len + (checksum ? 4 : 0);
        }
    }

    /** Blocks whose matches may reach into earlier blocks: decoded into one array, so those bytes are there. */
    private static int linkedBlocks(byte[] src, byte[] dst, boolean checksum) {
        int sp = 0;
        int dp = 0;
        while (true) {
            int word = (src[sp] & 0xff) | (src[sp + 1] & 0xff) << 8 | (src[sp + 2] & 0xff) << 16 | src[sp + 3] << 24;
            sp += 4;
            if (word == 0) {
                return dp;
            }
            int len = word & 0x7fffffff;
            if (len > src.length - sp) {
                throw corrupt("a block of " + len + " bytes runs past the frame");
            }
            if (word < 0) {
                System.arraycopy(src, sp, dst, dp, len);
                dp += len;
            } else {
                dp = block(src, sp, sp + len, dst, dp);
            }
            sp += len + (checksum ? 4 : 0);
        }
    }

    /** One LZ4 block (the block format) from src[sp, end) at dst[dp]; where the output ends. */
    private static int block(byte[] src, int sp, int end, byte[] dst, int dp) {
        while (true) {
            int token = src[sp++] & 0xff;
            int literals = token >>> 4;
            if (literals == 15) {
                int b;
                do {
                    b = src[sp++] & 0xff;
                    literals += b;
                } while (b == 255);
            }
            System.arraycopy(src, sp, dst, dp, literals);
            sp += literals;
            dp += literals;
            if (sp >= end) {
                if (sp > end) {
                    throw corrupt("a block's literals run past its end");
                }
                return dp;
            }
            int offset = (src[sp] & 0xff) | (src[sp + 1] & 0xff) << 8;
            sp += 2;
            if (offset == 0 || offset > dp) {
                throw corrupt("a match reaches before the frame's start");
            }
            int length = token & 15;
            if (length == 15) {
                int b;
                do {
                    b = src[sp++] & 0xff;
                    length += b;
                } while (b == 255);
            }
            length += 4;
            int from = dp - offset;
            if (offset >= length) {
                System.arraycopy(dst, from, dst, dp, length);
            } else {
                for (int i = 0; i < length; i++) {
                    dst[dp + i] = dst[from + i];
                }
            }
            dp += length;
        }
    }

    private static IllegalStateException corrupt(String why) {
        return new IllegalStateException("corrupt LZ4 frame in an Arrow buffer: " + why);
    }

    @Override
    public CompressionUtil.CodecType getCodecType() {
        return CompressionUtil.CodecType.LZ4_FRAME;
    }
}
