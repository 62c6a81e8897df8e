package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.contract.Contract;

/**
 * A stream read by the JVM ({@code readStream.format("pipelined")} with the plugin jar, or
 * {@code readStream.table("<catalog>.<stream>")}): micro-batches ({@link EpochStream}) and, on Spark 4.3+, Real-time
 * Mode ({@link RealTimeEpochStream}).
 */
public final class StreamTable implements SupportsRead {
    private static final Logger LOG = LoggerFactory.getLogger(StreamTable.class);
    static final String REAL_TIME_INTERFACE = "org.apache.spark.sql.connector.read.streaming.SupportsRealTimeMode";
    static final String REAL_TIME_STREAM = "org.sparkflow.exchange.stream.RealTimeEpochStream";
    static final long LONGEST_WAIT_MILLIS = 20_000; // one wait at the coordinator, within a call's timeout
    private final StreamSettings settings;
    private final ReadSettings readSettings;
    private final CoordinatorClient coordinator;
    private final JsonNode desc;
    private final StructType schema;

    private StreamTable(StreamSettings settings, ReadSettings readSettings, CoordinatorClient coordinator,
                        JsonNode desc) {
        this.settings = settings;
        this.readSettings = readSettings;
        this.coordinator = coordinator;
        this.desc = desc;
        this.schema = ArrowUtils.fromArrowSchema(ExchangeDescription.arrowSchema(settings.stream(),
                desc.path("schema").asText()));
    }

    /** Whether this Spark has Real-time Mode's source interfaces (4.3+). */
    public static boolean realTimeAvailable() {
        return realTimeUnavailable(REAL_TIME_INTERFACE) == null;
    }

    /**
     * Null when this JVM has {@code sourceInterface} (Real-time Mode's source interface), else why a Real-time Mode
     * query cannot read a stream here, naming the Spark it needs: the jar loads on older Sparks, where its streams
     * run in micro-batches.
     */
    public static String realTimeUnavailable(String sourceInterface) {
        try {
            Class.forName(sourceInterface, false, StreamTable.class.getClassLoader());
            return null;
        } catch (ClassNotFoundException | LinkageError e) {
            return "Real-time Mode (trigger(realTime=...)) needs Spark 4.3 or later, whose " + sourceInterface
                    + " this Spark (" + org.apache.spark.package$.MODULE$.SPARK_VERSION() + ") lacks; its stream "
                    + "queries read in micro-batches";
        }
    }

    /**
     * The stream's description, waiting up to {@code declareTimeout} for a writer query to declare it; null when
     * none did.
     */
    public static JsonNode describe(CoordinatorClient coordinator, StreamSettings settings) {
        StreamCalls calls = new StreamCalls(coordinator, settings.stream());
        long deadline = System.nanoTime() + (long) (settings.declareTimeoutSeconds() * 1e9);
        while (true) {
            long left = Math.max(0, (deadline - System.nanoTime()) / 1_000_000);
            JsonNode d = calls.describe(Math.min(left, LONGEST_WAIT_MILLIS) / 1000.0);
            if (d != null || left <= LONGEST_WAIT_MILLIS) {
                return d;
            }
        }
    }

    /**
     * Null when the JVM source reads this stream as the Python source does, else why not: it needs the stream's
     * width (written with numSubpartitions) and a layout where subpartition i is one read partition (hash or
     * rebalance).
     */
    public static String unreadable(JsonNode desc) {
        if (desc == null) {
            return "not declared";
        }
        String partitioner = desc.path("partitioner").path("name").asText("hash").toLowerCase(Locale.ROOT);
        if (!Set.copyOf(Contract.Partitioner.JVM_READ).contains(partitioner)) {
            return "partitioner " + partitioner;
        }
        if (!desc.path("num_subpartitions").canConvertToInt() || desc.path("coalesce").asBoolean(false)) {
            return "written without numSubpartitions";
        }
        return null;
    }

    /** The JVM's table of a declared stream {@code desc} (see {@link #unreadable}). */
    public static StreamTable of(StreamSettings settings, ReadSettings readSettings, CoordinatorClient coordinator,
                                 JsonNode desc) {
        return new StreamTable(settings, readSettings, coordinator, desc);
    }

    @Override
    public String name() {
        return settings.stream();
    }

    @Override
    public StructType schema() {
        return schema;
    }

    @Override
    public Map<String, String> properties() {
        return Map.of();
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        StreamSettings s = settings;
        if (!options.isEmpty()) { // readStream.table(...).option(...): the read's options over the table's
            Map<String, String> merged = new HashMap<>();
            merged.put(Contract.Option.CONSUMER_GROUP, settings.group());
            merged.put(Contract.Option.STARTING_EPOCHS, settings.startingEpochs());
            merged.values().removeIf(v -> v == null);
            merged.putAll(options.asCaseSensitiveMap());
            s = StreamSettings.of(settings.stream(), merged);
        }
        StreamSettings chosen = s;
        return () -> new Scan() {
            @Override
            public StructType readSchema() {
                return schema;
            }

            @Override
            public String description() {
                return "sparkflow-exchange stream " + settings.stream();
            }

            @Override
            public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
                return stream(chosen);
            }
        };
    }

    private MicroBatchStream stream(StreamSettings s) {
        int width = desc.path("num_subpartitions").asInt();
        int[] columns = new int[schema.fields().length];
        for (int i = 0; i < columns.length; i++) {
            columns[i] = i;
        }
        StreamCalls calls = new StreamCalls(coordinator, s.stream());
        String schemaBase64 = desc.path("schema").asText();
        String unavailable = realTimeUnavailable(REAL_TIME_INTERFACE);
        if (unavailable != null) {
            LOG.info("stream {}: {}", s.stream(), unavailable);
        } else {
            try {
                return (MicroBatchStream) Class.forName(REAL_TIME_STREAM).getConstructor(StreamSettings.class,
                        ReadSettings.class, StreamCalls.class, String.class, int.class, int[].class)
                        .newInstance(s, readSettings, calls, schemaBase64, width, columns);
            } catch (ReflectiveOperationException | LinkageError e) {
                LOG.warn("stream {}: Real-time Mode is not available ({}); micro-batches only (Real-time Mode needs "
                        + "Spark 4.3 or later)", s.stream(), e.toString());
            }
        }
        return new EpochStream(s, readSettings, calls, schemaBase64, width, columns);
    }
}
