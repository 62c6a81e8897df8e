package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.sparkflow.exchange.contract.Contract.Option;
import org.sparkflow.exchange.contract.Contract.OptionDefault;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.discovery.Discovery;
import org.sparkflow.exchange.discovery.RuntimeDir;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.write.ExchangeDataWriter;
import org.sparkflow.exchange.write.ProducerCommit;
import org.sparkflow.exchange.write.WriteHandle;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * {@code writeStream.format("pipelined")} served by the JVM (with the plugin jar, where the options fit): micro-batch
 * {@code batchId} of the writer query is epoch {@code batchId} of the stream, with the Python sink's exactly-once
 * rules (the service's {@code stream_begin_epoch}: a replay of a committed batch is skipped, one an earlier run left
 * open is replaced; a task waits while the stream retains more than {@code stream.maxRetainedBytes}). Each task
 * writes its rows as a producer of the epoch's exchange (write/ExchangeDataWriter) followed by the epoch marker;
 * a timer pushes what a task holds once it has waited {@code bufferTimeout} ({@code stream.bufferTimeout}, 1 ms by
 * default, unless set), so a Real-time Mode reader gets rows while the writer's long batch runs.
 */
public final class StreamSink implements SupportsWrite {
    /** Spark's own option: a query's checkpoint. */
    static final String SPARK_CHECKPOINT = "checkpointLocation";
    /** Options of a stream write beyond a batch write's (lower case): ours, then Spark's own. */
    public static final Set<String> STREAM_WRITE_OPTIONS = StreamSettings.lower(Option.STREAM_MAX_RETAINED_BYTES,
            Option.STREAM_CONSUMER_GROUPS, Option.READER_TIMEOUT, Option.STREAM_BUFFER_TIMEOUT, SPARK_CHECKPOINT,
            StreamSettings.SPARK_PATH, StreamSink.ASYNC_SINK_CHECK);
    /**
     * Real-time Mode tracks progress asynchronously, which Spark 4.3 allows for sinks it names only (Kafka, memory,
     * console, foreach, noop); this writeStream option ({@code "true"}) lets it run with this sink.
     */
    public static final String ASYNC_SINK_CHECK = "_asyncProgressTrackingOverrideSinkSupportCheck";
    static final double WAIT_ROUND_SECONDS = 5.0; // one begin-epoch call's wait on the service (streaming.py WAIT_ROUND)
    private final String name;
    private final WriteSettings settings;
    private final Map<String, String> options;
    private final HashMap<String, String> discovery;

    public StreamSink(String name, Map<String, String> options, Map<String, String> discovery) {
        this.name = name;
        Map<String, String> o = new HashMap<>(options);
        // a stream's buffer timeout unless bufferTimeout is given: stream.bufferTimeout (1 ms by default, Flink's
        // "about a millisecond" setting; its 100 ms default is a batch exchange's): a Real-time Mode hop is meant to
        // take milliseconds, and a full buffer or the flush-cost rule still bound the small buffers it makes
        if (o.keySet().stream().noneMatch(k -> k.equalsIgnoreCase(Option.BUFFER_TIMEOUT))) {
            String stream = option(options, Option.STREAM_BUFFER_TIMEOUT);
            o.put(Option.BUFFER_TIMEOUT, stream != null ? stream : OptionDefault.STREAM_BUFFER_TIMEOUT + "s");
        }
        o.keySet().removeIf(k -> k.equalsIgnoreCase(Option.STREAM_BUFFER_TIMEOUT));
        this.settings = WriteSettings.defaults().with(List.of(o));
        this.options = options;
        this.discovery = new HashMap<>(discovery);
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public StructType schema() {
        return new StructType();
    }

    @Override
    public String toString() {
        return "sparkflow-exchange stream " + name + " (JVM sink)";
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.STREAMING_WRITE, TableCapability.ACCEPT_ANY_SCHEMA);
    }

    private String option(String key) {
        return option(options, key);
    }

    private static String option(Map<String, String> options, String key) {
        return options.entrySet().stream().filter(e -> e.getKey().equalsIgnoreCase(key)).map(Map.Entry::getValue)
                .findFirst().orElse(null);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        return new UpdateAsAppend() {
            @Override
            public Write build() {
                return new Write() {
                    @Override
                    public StreamingWrite toStreaming() {
                        return declare(info);
                    }
                };
            }
        };
    }

    /** Update mode writes each updated row as it comes (a stream is a sequence of rows: there is nothing to update). */
    private interface UpdateAsAppend extends WriteBuilder,
            org.apache.spark.sql.internal.connector.SupportsStreamingUpdateAsAppend {}

    private EpochWrite declare(LogicalWriteInfo info) {
        CoordinatorClient coordinator = new CoordinatorClient(Discovery.find(discovery, RuntimeDir.standard()));
        String schema = arrowSchemaBase64(info.schema());
        String retained = option(Option.STREAM_MAX_RETAINED_BYTES);
        String groups = option(Option.STREAM_CONSUMER_GROUPS);
        List<String> groupList = new ArrayList<>();
        if (groups != null) {
            for (String g : groups.split(",")) {
                if (!g.isBlank()) {
                    groupList.add(g.trim());
                }
            }
        }
        JsonNode desc = new StreamCalls(coordinator, name).declare(schema, settings, retained == null ? 0
                : WriteSettings.size(Option.STREAM_MAX_RETAINED_BYTES, retained, Long.MAX_VALUE), groupList);
        String timeout = option(Option.READER_TIMEOUT);
        long readerTimeout = WriteSettings.duration(Option.READER_TIMEOUT,
                timeout == null ? OptionDefault.READER_TIMEOUT + "s" : timeout);
        return new EpochWrite(name, desc.path("schema").asText(schema), info.schema(),
                desc.path("num_subpartitions").asInt(settings.numSubpartitions()), settings, discovery,
                UUID.randomUUID().toString().replace("-", ""), info.queryId(), readerTimeout);
    }

    /** {@code schema} as the Python writer declares it (Arrow, UTC timestamps, an IPC schema message in base64). */
    static String arrowSchemaBase64(StructType schema) {
        org.apache.arrow.vector.types.pojo.Schema arrow = ArrowUtils.toArrowSchema(schema, "UTC", false, false, false);
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        try {
            org.apache.arrow.vector.ipc.message.MessageSerializer.serialize(
                    new org.apache.arrow.vector.ipc.WriteChannel(java.nio.channels.Channels.newChannel(out)), arrow);
        } catch (java.io.IOException e) {
            throw new IllegalStateException("cannot serialise the stream's Arrow schema: " + e, e);
        }
        return java.util.Base64.getEncoder().encodeToString(out.toByteArray());
    }

    /** {@code buffer_kinds.epoch_marker}: {@code ">4sq"}, b"EPCH" and the epoch. */
    static byte[] epochMarker(long epoch) {
        return ByteBuffer.allocate(12).put("EPCH".getBytes(StandardCharsets.US_ASCII)).putLong(epoch).array();
    }

    /** One start of the writer query ({@code run}): its epochs' tasks and commits. */
    record EpochWrite(String stream, String schemaBase64, StructType schema, int width, WriteSettings settings,
                      HashMap<String, String> discovery, String run, String queryId, long readerTimeoutNanos)
            implements StreamingWrite, StreamingDataWriterFactory {
        @Override
        public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
            return this;
        }

        @Override
        public boolean useCommitCoordinator() {
            return true;
        }

        private CoordinatorClient coordinator() {
            return new CoordinatorClient(Discovery.find(discovery, RuntimeDir.standard()));
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
            TaskContext ctx = TaskContext.get();
            String query = ctx != null && ctx.getLocalProperty("sql.streaming.queryId") != null
                    ? ctx.getLocalProperty("sql.streaming.queryId") : queryId;
            CoordinatorClient coordinator = coordinator();
            JsonNode answer = begin(coordinator, epochId, query);
            if (answer.path("skip").asBoolean(false)) {
                return new Skipped();
            }
            WriteHandle handle = new WriteHandle(answer.path("exchange").asText(), answer.path("generation").asLong(),
                    answer.path("write_id").asText(), answer.path("schema").asText(schemaBase64), schema,
                    answer.path("num_subpartitions").canConvertToInt() ? answer.get("num_subpartitions").asInt() : width,
                    settings, discovery, WriteHandle.privateReaders(answer));
            int attemptNumber = ctx == null ? 0 : ctx.attemptNumber();
            String attempt = partitionId + "-" + attemptNumber + "-" + taskId;
            return new TimedWriter(ExchangeDataWriter.forEpoch(handle, partitionId, attempt, epochMarker(epochId)),
                    settings.bufferTimeoutNanos());
        }

        /** The epoch to write, or a skip; waits (backpressure) while some consumer group still moves on. */
        private JsonNode begin(CoordinatorClient coordinator, long epoch, String query) {
            long deadline = System.nanoTime() + readerTimeoutNanos;
            String last = null;
            while (true) {
                double left = Math.max(0, (deadline - System.nanoTime()) / 1e9);
                JsonNode answer = coordinator.call("stream_begin_epoch", Map.of("name", stream, "epoch", epoch,
                        "query", query, "run", run, "wait", Math.min(WAIT_ROUND_SECONDS, left)));
                JsonNode waiting = answer.get("waiting");
                if (waiting == null || waiting.isNull()) {
                    return answer;
                }
                String position = waiting.path("released_upto").asText() + waiting.path("groups").toString()
                        .replaceAll("\"idle_s\":[0-9.]+", "");
                if (!position.equals(last)) {
                    last = position;
                    deadline = System.nanoTime() + readerTimeoutNanos;
                } else if (System.nanoTime() >= deadline) {
                    throw new IllegalStateException("stream '" + stream + "': micro-batch " + epoch + " waited "
                            + readerTimeoutNanos / 1_000_000_000L + " s (readerTimeout) for its readers: the stream "
                            + "retains " + waiting.path("retained_bytes").asLong() + " bytes, more than "
                            + "stream.maxRetainedBytes=" + waiting.path("max_retained_bytes").asLong() + ", and no "
                            + "consumer group moved on; start the reader query, or drop a group that is gone for good "
                            + "with sparkflow_exchange.leave_group(name, group)");
                }
            }
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
            List<String> partitions = new ArrayList<>();
            Map<String, Long> rows = new LinkedHashMap<>();
            for (WriterCommitMessage m : messages) {
                if (m instanceof ProducerCommit c && !c.partition().isEmpty()) {
                    partitions.add(c.partition());
                    rows.put(c.partition(), c.rows());
                }
            }
            coordinator().call("stream_commit_epoch", Map.of("name", stream, "epoch", epochId,
                    "partitions", partitions, "rows", rows));
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
            try {
                coordinator().call("stream_abort_epoch", Map.of("name", stream, "epoch", epochId,
                        "reason", "the micro-batch failed"));
            } catch (ServiceError | IllegalStateException ignored) {
                // the service is gone: nothing of the epoch is left to drop
            }
        }

        @Override
        public String toString() {
            return "sparkflow-exchange stream " + stream + " (JVM sink)";
        }
    }

    /** A replay of a committed epoch: its rows are in the stream once already. */
    private static final class Skipped implements DataWriter<InternalRow> {
        @Override
        public void write(InternalRow row) {}

        @Override
        public WriterCommitMessage commit() {
            return new ProducerCommit("", -1, 0);
        }

        @Override
        public void abort() {}

        @Override
        public void close() {}
    }

    /**
     * The task's producer, with a timer that pushes what it holds once that waited {@code bufferTimeout}: rows leave
     * while the task's input is idle (a Real-time Mode task runs for its whole batch). The timer and the task take
     * turns on the writer's monitor; the timer waits on it and is woken to stop, never interrupted: an interrupt
     * landing in a flush fails the flush's I/O after its rows left the encoder, and those rows would be lost.
     */
    private static final class TimedWriter implements DataWriter<InternalRow> {
        private final ExchangeDataWriter writer;
        private final Thread timer;
        private boolean done; // under the writer's monitor
        private volatile RuntimeException failed;

        TimedWriter(ExchangeDataWriter writer, long timeoutNanos) {
            this.writer = writer;
            long tick = Math.max(200_000L, timeoutNanos);
            this.timer = new Thread(() -> {
                synchronized (writer) {
                    while (!done) {
                        try {
                            writer.wait(tick / 1_000_000, (int) (tick % 1_000_000)); // the task writes meanwhile
                        } catch (InterruptedException e) {
                            return; // not ours to be interrupted: the writer's own commit still pushes everything
                        }
                        if (done) {
                            return;
                        }
                        try {
                            writer.flushIfDue();
                        } catch (RuntimeException e) {
                            failed = e;
                            return;
                        }
                    }
                }
            }, "sparkflow-stream-flusher");
            timer.setDaemon(true);
            timer.start();
        }

        @Override
        public void write(InternalRow row) {
            synchronized (writer) {
                if (failed != null) {
                    throw failed;
                }
                writer.write(row);
            }
        }

        /** The timer stopped: out of any flush, and it flushes no more. */
        private void stop() {
            synchronized (writer) {
                done = true;
                writer.notifyAll();
            }
        }

        @Override
        public WriterCommitMessage commit() {
            stop();
            synchronized (writer) {
                if (failed != null) {
                    throw failed;
                }
                return writer.commit();
            }
        }

        @Override
        public void abort() {
            stop();
            synchronized (writer) {
                writer.abort();
            }
        }

        @Override
        public void close() {
            stop();
            synchronized (writer) {
                writer.close();
            }
        }
    }

    /** Null when a stream write's options fit this sink, else why not (the Python sink serves it then). */
    public static String unsupported(Map<String, String> options, Set<String> batchWriteOptions) {
        String exchange = options.entrySet().stream().filter(e -> e.getKey().equalsIgnoreCase(Option.EXCHANGE))
                .map(Map.Entry::getValue).findFirst().orElse(null);
        if (exchange == null || exchange.isEmpty()) {
            return "no exchange option";
        }
        for (String key : options.keySet()) {
            String k = key.toLowerCase(Locale.ROOT);
            if (!batchWriteOptions.contains(k) && !STREAM_WRITE_OPTIONS.contains(k)) {
                return "option " + key;
            }
        }
        Map<String, String> lower = new HashMap<>();
        options.forEach((k, v) -> lower.put(k.toLowerCase(Locale.ROOT), v));
        if (!lower.containsKey(Option.NUM_SUBPARTITIONS.toLowerCase(Locale.ROOT))) {
            return "no " + Option.NUM_SUBPARTITIONS;
        }
        String partitioner = lower.getOrDefault(Option.PARTITIONER.toLowerCase(Locale.ROOT), OptionDefault.PARTITIONER)
                .toLowerCase(Locale.ROOT);
        // what the JVM writer writes and its stream source reads, as the Python reader does
        if (!org.sparkflow.exchange.contract.Contract.Partitioner.JVM_READ.contains(partitioner)) {
            return "partitioner " + partitioner;
        }
        return null;
    }
}
