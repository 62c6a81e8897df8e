package org.sparkflow.exchange.codec;

import java.util.List;
import java.util.Locale;
import org.apache.arrow.compression.ZstdCompressionCodec;
import org.apache.arrow.vector.compression.CompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil.CodecType;
import org.apache.arrow.vector.compression.NoCompressionCodec;
import org.sparkflow.exchange.contract.Contract;

/**
 * Arrow IPC body compression for the JVM writer and reader, the codecs {@code buffer.BatchEncoder} writes:
 * ZSTD through Arrow's own codec (native, zstd-jni) at the contract's level, LZ4_FRAME through
 * {@link Lz4FrameCodec} (native lz4-java blocks; Arrow Java's own LZ4 codec is pure Java and very slow).
 * The option's names live here for the JVM, as {@code config.COMPRESSIONS} for Python (tests check they agree).
 */
public final class Codecs implements CompressionCodec.Factory {
    /** The {@code compression} option's values (the contract's {@code options.keys.compression.choices}, in its order). */
    public static final List<String> NAMES = Contract.Compression.CODECS;
    /** The default of the {@code compression} option: the contract's {@code options.keys.compression.default}, as Python's. */
    public static final String DEFAULT = Contract.Compression.DEFAULT;
    /**
     * The contract's {@code compression.zstd_level}, Python's {@code ipc_body.ZSTD_LEVEL}: 1, Arrow C++'s default;
     * Arrow Java's default, 3, is slower for little gain.
     */
    static final int ZSTD_LEVEL = Contract.CompressionLevel.ZSTD;
    public static final Codecs INSTANCE = new Codecs();

    private Codecs() {}

    /** The option's value, lower case, if it names a codec; else an IllegalArgumentException saying the choices. */
    public static String checked(String name) {
        String n = name == null ? DEFAULT : name.strip().toLowerCase(Locale.ROOT);
        if (!NAMES.contains(n)) {
            throw new IllegalArgumentException("unknown compression '" + name + "'; use one of "
                    + String.join(", ", NAMES));
        }
        return n;
    }

    /**
     * The codec that writes buffers for the option's value ({@link #checked} names); a buffer it cannot shrink by
     * the contract's {@code min_saving_percent} is written as it is ({@link StoredWhenLarger}). One writer's, one
     * thread at a time: ZSTD keeps one native context for all of its buffers ({@link ZstdContextCodec}), freed by
     * {@link #close}.
     */
    public static CompressionCodec forName(String name) {
        return switch (checked(name)) {
            case "zstd" -> new StoredWhenLarger(ZstdContextCodec.forWriting(ZSTD_LEVEL));
            case "lz4" -> new StoredWhenLarger(INSTANCE.createCodec(CodecType.LZ4_FRAME));
            default -> NoCompressionCodec.INSTANCE;
        };
    }

    /** Free what a codec of {@link #forName} holds outside the Java heap (none holds anything else); idempotent. */
    public static void close(CompressionCodec codec) {
        if (codec instanceof AutoCloseable closeable) {
            try {
                closeable.close();
            } catch (Exception e) {
                throw new IllegalStateException("cannot close the " + codec.getCodecType() + " codec: " + e, e);
            }
        }
    }

    /**
     * The codecs one reader decompresses with, one thread at a time: ZSTD keeps one native context for all of the
     * reader's buffers, made at its first compressed one and freed by {@link Reading#close}.
     */
    public static Reading forReading() {
        return new Reading();
    }

    /** A reader's codecs (see {@link #forReading}). */
    public static final class Reading implements CompressionCodec.Factory, AutoCloseable {
        private ZstdContextCodec.Decompressing zstd;
        private boolean closed;

        private Reading() {}

        @Override
        public CompressionCodec createCodec(CodecType type) {
            if (type != CodecType.ZSTD) {
                return INSTANCE.createCodec(type);
            }
            if (zstd == null) {
                if (closed) {
                    throw new IllegalStateException("the reader's codecs are closed: its read ended");
                }
                zstd = ZstdContextCodec.forReading();
            }
            return zstd;
        }

        @Override
        public CompressionCodec createCodec(CodecType type, int level) {
            return createCodec(type); // decompressing needs no level
        }

        /** Free the ZSTD context, if one was made (idempotent). */
        @Override
        public void close() {
            closed = true;
            if (zstd != null) {
                zstd.close();
            }
        }
    }

    @Override
    public CompressionCodec createCodec(CodecType type) {
        return createCodec(type, ZSTD_LEVEL);
    }

    @Override
    public CompressionCodec createCodec(CodecType type, int level) {
        return switch (type) {
            case ZSTD -> new ZstdCompressionCodec(level);
            case LZ4_FRAME -> Lz4FrameCodec.INSTANCE;
            case NO_COMPRESSION -> NoCompressionCodec.INSTANCE;
        };
    }
}
