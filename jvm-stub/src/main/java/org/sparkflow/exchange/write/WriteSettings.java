package org.sparkflow.exchange.write;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.expressions.BucketTransform;
import org.sparkflow.exchange.codec.Codecs;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.Transform;
import org.sparkflow.exchange.wire.Contract;

/**
 * How a catalog write routes and cuts its rows, under the Python options' names ({@code config.py}):
 * {@code partitioner} (hash, broadcast, forward, rebalance), {@code keys}, {@code numSubpartitions},
 * {@code partitionType}, {@code bufferSize}, {@code sortBufferSize}, {@code buffersPerPartition},
 * {@code bufferTimeout} (a partly filled buffer leaves after this: what a reader of a write in progress waits),
 * {@code compression} (none, zstd, lz4: Arrow IPC body compression, as the Python writer's). Keys are
 * case-insensitive; a table property may also carry Spark's {@code option.} prefix.
 */
public record WriteSettings(String partitioner, List<String> keys, Integer numSubpartitions, String partitionType,
                            int bufferSize, long sortBufferSize, int buffers, long bufferTimeoutNanos,
                            String compression)
        implements Serializable {
    public static final List<String> PARTITIONERS = Contract.Partitioner.JVM_WRITE; // hash, broadcast, forward, rebalance
    static final List<String> PARTITION_TYPES = Contract.PartitionType.ALL;
    /** Size suffixes (lower case) and their bytes: config.py's _SIZE_UNITS, entry for entry (tests check it). */
    static final Map<String, Long> SIZE_UNITS = Map.ofEntries(Map.entry("", 1L), Map.entry("b", 1L),
            Map.entry("k", 1L << 10), Map.entry("kb", 1L << 10), Map.entry("kib", 1L << 10),
            Map.entry("m", 1L << 20), Map.entry("mb", 1L << 20), Map.entry("mib", 1L << 20),
            Map.entry("g", 1L << 30), Map.entry("gb", 1L << 30), Map.entry("gib", 1L << 30));
    /** Duration suffixes (lower case) and their seconds: config.py's _TIME_UNITS, entry for entry. */
    static final Map<String, Double> TIME_UNITS = Map.ofEntries(Map.entry("ms", 0.001), Map.entry("s", 1.0),
            Map.entry("", 1.0), Map.entry("sec", 1.0), Map.entry("m", 60.0), Map.entry("min", 60.0),
            Map.entry("h", 3600.0));
    /** The service's default maxFrameSize (config.py): a buffer may be at most half of a frame. */
    static final long MAX_FRAME_SIZE = 64L << 20;

    /**
     * The Python writer's defaults: hash, HYBRID, 1 MiB buffers, a 32 MiB sort buffer, 16 pool buffers, 100 ms, and
     * the session's compression (none unless set).
     */
    public static WriteSettings defaults() {
        return new WriteSettings("hash", List.of(), null, "HYBRID", 1 << 20, 32L << 20, 16, 100_000_000L,
                sessionCompression());
    }

    /**
     * {@code spark.sparkflow.exchange.compression} of the active session (its conf falls back to the application's),
     * as the Python writer reads it, else {@link Codecs#DEFAULT}: one setting compresses both writers' exchanges.
     */
    static String sessionCompression() {
        scala.Option<SparkSession> session = SparkSession.getActiveSession();
        String value = session.isDefined()
                ? session.get().conf().get("spark.sparkflow.exchange.compression", null) : null;
        return value == null ? Codecs.DEFAULT : Codecs.checked(value);
    }

    /** These settings with another layout (partitioner, keys, width, partition type), the buffers' settings kept. */
    public WriteSettings withLayout(String p, List<String> k, Integer n, String type) {
        return new WriteSettings(p, k, n, type, bufferSize, sortBufferSize, buffers, bufferTimeoutNanos, compression);
    }

    /** These settings with {@code options} applied over them (later maps win); {@link #checked} says if they hold. */
    public WriteSettings with(List<Map<String, String>> options) {
        Map<String, String> o = new HashMap<>();
        for (Map<String, String> layer : options) {
            layer.forEach((k, v) -> o.put(k.toLowerCase(Locale.ROOT).replaceFirst("^option\\.", ""), v));
        }
        String p = o.getOrDefault("partitioner", partitioner).toLowerCase(Locale.ROOT);
        List<String> k = o.containsKey("keys") ? splitKeys(o.get("keys")) : keys;
        Integer n = o.containsKey("numsubpartitions") ? Integer.valueOf(positive("numSubpartitions", o.get("numsubpartitions")))
                : numSubpartitions;
        String type = o.getOrDefault("partitiontype", partitionType).toUpperCase(Locale.ROOT);
        int size = o.containsKey("buffersize") ? (int) size("bufferSize", o.get("buffersize")) : bufferSize;
        long frame = o.containsKey("maxframesize") ? size("maxFrameSize", o.get("maxframesize")) : MAX_FRAME_SIZE;
        if (size > frame / 2) { // as the Python writer: refused before anything is declared, not in every task
            throw new IllegalArgumentException("bufferSize " + size + " must be at most half of maxFrameSize " + frame);
        }
        long sort = o.containsKey("sortbuffersize") ? size("sortBufferSize", o.get("sortbuffersize")) : sortBufferSize;
        int pool = o.containsKey("buffersperpartition")
                ? positive("buffersPerPartition", o.get("buffersperpartition")) : buffers;
        long timeout = o.containsKey("buffertimeout") ? duration("bufferTimeout", o.get("buffertimeout"))
                : bufferTimeoutNanos;
        // refused here, before anything is declared, as the Python writer's settings refuse it
        String codec = o.containsKey("compression") ? Codecs.checked(o.get("compression")) : compression;
        return new WriteSettings(p, k, n, type, size, sort, pool, timeout, codec);
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
        return withLayout("hash", k, (Integer) bucket.numBuckets().value(), partitionType);
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
        if ("hash".equals(partitioner) && keys.isEmpty()) {
            throw new IllegalArgumentException("the hash partitioner needs the 'keys' option (comma-separated columns)");
        }
        if ("broadcast".equals(partitioner) && "PIPELINED_BOUNDED".equals(partitionType) && numSubpartitions == null) {
            throw new IllegalArgumentException("broadcast with partitionType PIPELINED_BOUNDED needs numSubpartitions");
        }
        return this;
    }

    /** One subpartition per producer: its own (forward) or every reader's (broadcast). */
    public boolean single() {
        return "forward".equals(partitioner) || "broadcast".equals(partitioner);
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

    /** Nanoseconds of a duration: seconds, or a number with a suffix of {@link #TIME_UNITS} (as the Python settings). */
    public static long duration(String key, String value) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("\\s*(\\d+(?:\\.\\d+)?)\\s*([a-zA-Z]*)\\s*")
                .matcher(value);
        if (m.matches()) {
            Double unit = TIME_UNITS.get(m.group(2).toLowerCase(Locale.ROOT));
            if (unit != null) {
                return (long) (Double.parseDouble(m.group(1)) * unit * 1e9);
            }
        }
        throw new IllegalArgumentException(key + " must be a duration (seconds, or a suffix ms, s, min, h), got '"
                + value + "'");
    }

    /** Bytes: a number with an optional suffix of {@link #SIZE_UNITS} (k, m, g: KiB, MiB, GiB), as config.py. */
    public static long size(String key, String value) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("\\s*(\\d+)\\s*([a-zA-Z]*)\\s*").matcher(value);
        if (m.matches()) {
            Long unit = SIZE_UNITS.get(m.group(2).toLowerCase(Locale.ROOT));
            try {
                long n = unit == null ? -1 : Math.multiplyExact(Long.parseLong(m.group(1)), unit);
                if (n >= 1 && n <= Integer.MAX_VALUE) {
                    return n;
                }
            } catch (ArithmeticException | NumberFormatException ignored) {
                // said below
            }
        }
        throw new IllegalArgumentException(key + " must be a size in bytes (e.g. 1m), got '" + value + "'");
    }
}
