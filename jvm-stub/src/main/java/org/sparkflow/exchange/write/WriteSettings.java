package org.sparkflow.exchange.write;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.expressions.BucketTransform;
import org.sparkflow.exchange.codec.Codecs;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.Transform;
import org.sparkflow.exchange.contract.Contract;

/**
 * How a catalog write routes and cuts its rows, under the Python options' names ({@code config.py}):
 * {@code partitioner} (hash, broadcast, forward, rebalance), {@code keys}, {@code numSubpartitions},
 * {@code partitionType}, {@code bufferSize}, {@code sortBufferSize}, {@code buffersPerPartition},
 * {@code bufferTimeout} (a partly filled buffer leaves after this: what a reader of a write in progress waits),
 * {@code compression} (none, zstd, lz4: Arrow IPC body compression, as the Python writer's),
 * {@code compressionThread} (compressed buffers are compressed and pushed on a thread of each writer's own). Keys are
 * case-insensitive; a table property may also carry Spark's {@code option.} prefix. The keys, their defaults and how
 * sizes and durations are read are the contract's ({@code sparkflow_exchange/contract.json}, through the generated
 * {@link Contract}), as Python's settings are: none is spelled here.
 */
public record WriteSettings(String partitioner, List<String> keys, Integer numSubpartitions, String partitionType,
                            int bufferSize, long sortBufferSize, int buffers, long bufferTimeoutNanos,
                            String compression, boolean compressionThread, List<String> readers)
        implements Serializable {
    public static final List<String> PARTITIONERS = Contract.Partitioner.JVM_WRITE; // hash, broadcast, forward, rebalance
    /** The write options the JVM writer honours (lower case, as Spark's options map keeps them). */
    public static final java.util.Set<String> OPTIONS = java.util.stream.Stream.of(Contract.Option.EXCHANGE,
                    Contract.Option.PARTITIONER, Contract.Option.KEYS, Contract.Option.NUM_SUBPARTITIONS,
                    Contract.Option.PARTITION_TYPE, Contract.Option.BUFFER_SIZE, Contract.Option.SORT_BUFFER_SIZE,
                    Contract.Option.BUFFERS_PER_PARTITION, Contract.Option.BUFFER_TIMEOUT, Contract.Option.COMPRESSION,
                    Contract.Option.COMPRESSION_THREAD, Contract.Option.READERS)
            .map(k -> k.toLowerCase(Locale.ROOT)).collect(java.util.stream.Collectors.toUnmodifiableSet());
    static final List<String> PARTITION_TYPES = Contract.PartitionType.ALL;
    private static final Pattern SIZE = Pattern.compile(Contract.Units.SIZE_PATTERN);
    private static final Pattern DURATION = Pattern.compile(Contract.Units.DURATION_PATTERN);

    /**
     * The contract's defaults (the Python writer's, from the same file): partitioner, partition type, buffer and sort
     * buffer sizes, pool buffers, buffer timeout, and the session's compression (the contract's unless set).
     */
    public static WriteSettings defaults() {
        return new WriteSettings(Contract.OptionDefault.PARTITIONER, Contract.OptionDefault.KEYS,
                Contract.OptionDefault.NUM_SUBPARTITIONS, Contract.OptionDefault.PARTITION_TYPE,
                Math.toIntExact(Contract.OptionDefault.BUFFER_SIZE), Contract.OptionDefault.SORT_BUFFER_SIZE,
                Contract.OptionDefault.BUFFERS_PER_PARTITION, nanos(Contract.OptionDefault.BUFFER_TIMEOUT),
                sessionCompression(), sessionCompressionThread(), Contract.OptionDefault.READERS);
    }

    /**
     * {@code spark.sparkflow.exchange.compression} of the active session (its conf falls back to the application's),
     * as the Python writer reads it, else the contract's default: one setting compresses both writers' exchanges.
     */
    static String sessionCompression() {
        scala.Option<SparkSession> session = SparkSession.getActiveSession();
        String value = session.isDefined()
                ? session.get().conf().get(Contract.Option.PREFIX + Contract.Option.COMPRESSION, null) : null;
        return value == null ? Contract.OptionDefault.COMPRESSION : Codecs.checked(value);
    }

    /**
     * {@code spark.sparkflow.exchange.compressionThread} of the active session, else the contract's default: whether
     * a compressed write compresses and pushes its buffers on a thread of each writer's own.
     */
    static boolean sessionCompressionThread() {
        scala.Option<SparkSession> session = SparkSession.getActiveSession();
        String key = Contract.Option.PREFIX + Contract.Option.COMPRESSION_THREAD;
        String value = session.isDefined() ? session.get().conf().get(key, null) : null;
        return value == null ? Contract.OptionDefault.COMPRESSION_THREAD : bool(key, value);
    }

    /** These settings with another layout (partitioner, keys, width, partition type), the buffers' settings kept. */
    public WriteSettings withLayout(String p, List<String> k, Integer n, String type) {
        return new WriteSettings(p, k, n, type, bufferSize, sortBufferSize, buffers, bufferTimeoutNanos, compression,
                compressionThread, readers);
    }

    /** These settings with {@code options} applied over them (later maps win); {@link #checked} says if they hold. */
    public WriteSettings with(List<Map<String, String>> options) {
        Map<String, String> o = new HashMap<>();
        for (Map<String, String> layer : options) {
            layer.forEach((k, v) -> o.put(k.toLowerCase(Locale.ROOT).replaceFirst("^option\\.", ""), v));
        }
        String p = get(o, Contract.Option.PARTITIONER, partitioner).toLowerCase(Locale.ROOT);
        List<String> k = has(o, Contract.Option.KEYS) ? splitKeys(get(o, Contract.Option.KEYS, null)) : keys;
        Integer n = has(o, Contract.Option.NUM_SUBPARTITIONS)
                ? Integer.valueOf(positive(Contract.Option.NUM_SUBPARTITIONS, get(o, Contract.Option.NUM_SUBPARTITIONS, null)))
                : numSubpartitions;
        String type = get(o, Contract.Option.PARTITION_TYPE, partitionType).toUpperCase(Locale.ROOT);
        int size = has(o, Contract.Option.BUFFER_SIZE)
                ? Math.toIntExact(size(Contract.Option.BUFFER_SIZE, get(o, Contract.Option.BUFFER_SIZE, null), Integer.MAX_VALUE))
                : bufferSize;
        long frame = has(o, Contract.Option.MAX_FRAME_SIZE)
                ? size(Contract.Option.MAX_FRAME_SIZE, get(o, Contract.Option.MAX_FRAME_SIZE, null), Long.MAX_VALUE)
                : Contract.OptionDefault.MAX_FRAME_SIZE;
        if (size > frame / 2) { // as the Python writer: refused before anything is declared, not in every task
            throw new IllegalArgumentException(Contract.Option.BUFFER_SIZE + " " + size + " must be at most half of "
                    + Contract.Option.MAX_FRAME_SIZE + " " + frame);
        }
        long sort = has(o, Contract.Option.SORT_BUFFER_SIZE)
                ? size(Contract.Option.SORT_BUFFER_SIZE, get(o, Contract.Option.SORT_BUFFER_SIZE, null), Long.MAX_VALUE)
                : sortBufferSize;
        int pool = has(o, Contract.Option.BUFFERS_PER_PARTITION)
                ? positive(Contract.Option.BUFFERS_PER_PARTITION, get(o, Contract.Option.BUFFERS_PER_PARTITION, null))
                : buffers;
        long timeout = has(o, Contract.Option.BUFFER_TIMEOUT)
                ? duration(Contract.Option.BUFFER_TIMEOUT, get(o, Contract.Option.BUFFER_TIMEOUT, null))
                : bufferTimeoutNanos;
        // refused here, before anything is declared, as the Python writer's settings refuse it
        String codec = has(o, Contract.Option.COMPRESSION)
                ? Codecs.checked(get(o, Contract.Option.COMPRESSION, null)) : compression;
        boolean thread = has(o, Contract.Option.COMPRESSION_THREAD)
                ? bool(Contract.Option.COMPRESSION_THREAD, get(o, Contract.Option.COMPRESSION_THREAD, null))
                : compressionThread;
        // the credentials that may read it besides its owner (the coordinator checks the names): none, its default
        List<String> r = has(o, Contract.Option.READERS) ? splitKeys(get(o, Contract.Option.READERS, null)) : readers;
        return new WriteSettings(p, k, n, type, size, sort, pool, timeout, codec, thread, r);
    }

    /** {@code partitionedBy(bucket(n, k...))}: hash on k into n, the bucket function's own layout. */
    public WriteSettings withPartitioning(Transform[] partitions) {
        if (partitions == null || partitions.length == 0) {
            return this;
        }
        if (partitions.length != 1 || !(partitions[0] instanceof BucketTransform bucket)) {
            throw new IllegalArgumentException("an exchange is partitioned by one bucket(n, keys...) transform only, "
                    + "got " + java.util.Arrays.toString(partitions));
        }
        List<String> k = new ArrayList<>();
        for (NamedReference ref : bucket.references()) {
            k.add(String.join(".", ref.fieldNames()));
        }
        return withLayout(Contract.Partitioner.HASH, k, (Integer) bucket.numBuckets().value(), partitionType);
    }

    /** These settings, when they make a write; else an IllegalArgumentException saying what is wrong. */
    public WriteSettings checked() {
        if (!PARTITIONERS.contains(partitioner)) {
            throw new IllegalArgumentException("partitioner '" + partitioner + "' is not written by the JVM writer; "
                    + "use one of " + String.join(", ", PARTITIONERS) + " (others: df.write.format(\"pipelined\"))");
        }
        if (!PARTITION_TYPES.contains(partitionType)) {
            throw new IllegalArgumentException("unknown partitionType '" + partitionType + "'; use one of "
                    + String.join(", ", PARTITION_TYPES));
        }
        if (Contract.Partitioner.KEYED.contains(partitioner) && keys.isEmpty()) {
            throw new IllegalArgumentException("the " + partitioner + " partitioner needs the '" + Contract.Option.KEYS
                    + "' option (comma-separated columns)");
        }
        if (Contract.Partitioner.BROADCAST.equals(partitioner) && Contract.PartitionType.PIPELINED_BOUNDED.equals(partitionType)
                && numSubpartitions == null) {
            throw new IllegalArgumentException("broadcast with partitionType PIPELINED_BOUNDED needs numSubpartitions");
        }
        return this;
    }

    /** One subpartition per producer: its own (forward) or every reader's (broadcast). */
    public boolean single() {
        return Contract.Partitioner.SINGLE_SUBPARTITION.contains(partitioner);
    }

    private static List<String> splitKeys(String text) {
        List<String> out = new ArrayList<>();
        for (String k : text.split(",")) {
            if (!k.isBlank()) {
                out.add(k.strip());
            }
        }
        return out;
    }

    /** The value of a key (case-insensitive: {@code o}'s keys are lower case), else {@code otherwise}. */
    private static String get(Map<String, String> o, String key, String otherwise) {
        return o.getOrDefault(key.toLowerCase(Locale.ROOT), otherwise);
    }

    private static boolean has(Map<String, String> o, String key) {
        return o.containsKey(key.toLowerCase(Locale.ROOT));
    }

    /** A bool as Python's settings read one (true/1/yes/on, false/0/no/off, any case); else an IllegalArgumentException. */
    private static boolean bool(String key, String value) {
        String v = value == null ? "" : value.strip().toLowerCase(Locale.ROOT);
        if (List.of("true", "1", "yes", "on").contains(v)) {
            return true;
        }
        if (List.of("false", "0", "no", "off").contains(v)) {
            return false;
        }
        throw new IllegalArgumentException(key + ": not a boolean: '" + value + "'");
    }

    private static int positive(String key, String value) {
        try {
            int n = Integer.parseInt(value.strip());
            if (n >= 1) {
                return n;
            }
        } catch (NumberFormatException ignored) {
            // said below
        }
        throw new IllegalArgumentException(key + " must be a positive integer, got '" + value + "'");
    }

    /**
     * Bytes of a size: a whole number with an optional suffix of the contract's table (k, m, g: KiB, MiB, GiB; any
     * case), as Python's {@code config.parse_size} reads it; an IllegalArgumentException otherwise.
     */
    public static long parseSize(String value) {
        Matcher m = value == null ? null : SIZE.matcher(value);
        if (m != null && m.matches()) {
            Long unit = Contract.Units.SIZE_SUFFIXES.get(m.group(2).toLowerCase(Locale.ROOT));
            try {
                long n = unit == null ? -1 : Math.multiplyExact(Long.parseLong(m.group(1)), unit);
                if (n >= 0 && n <= Contract.Units.SIZE_MAX) {
                    return n;
                }
            } catch (ArithmeticException | NumberFormatException ignored) {
                // more than a long: said below
            }
        }
        throw new IllegalArgumentException("not a size: '" + value + "' (" + Contract.Units.SIZE_HINT + ")");
    }

    /**
     * Seconds of a duration: a decimal number with an optional suffix of the contract's table (ms, s, min, h; any
     * case), as Python's {@code config.parse_duration} reads it, finite; an IllegalArgumentException otherwise.
     */
    public static double parseSeconds(String value) {
        Matcher m = value == null ? null : DURATION.matcher(value);
        if (m != null && m.matches()) {
            Double unit = Contract.Units.DURATION_SUFFIXES.get(m.group(2).toLowerCase(Locale.ROOT));
            double seconds = unit == null ? Double.POSITIVE_INFINITY : Double.parseDouble(m.group(1)) * unit;
            if (Double.isFinite(seconds)) {
                return seconds;
            }
        }
        throw new IllegalArgumentException("not a duration: '" + value + "' (" + Contract.Units.DURATION_HINT + ")");
    }

    /** Nanoseconds of a duration setting ({@link #parseSeconds}); the refusal names the key. */
    public static long duration(String key, String value) {
        try {
            return nanos(parseSeconds(value));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(key + ": " + e.getMessage(), e);
        }
    }

    private static long nanos(double seconds) {
        return (long) (seconds * 1e9);
    }

    /** Bytes of a size setting ({@link #parseSize}), at least 1 and at most {@code max}; the refusal names the key. */
    public static long size(String key, String value, long max) {
        long n;
        try {
            n = parseSize(value);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(key + ": " + e.getMessage(), e);
        }
        if (n < 1 || n > max) {
            throw new IllegalArgumentException(key + " must be at least 1 byte and at most " + max + ", got '" + value
                    + "'");
        }
        return n;
    }
}
