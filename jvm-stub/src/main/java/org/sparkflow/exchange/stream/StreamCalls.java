package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * The coordinator's stream calls a JVM reader or writer query makes (the service side is {@code service/streams.py};
 * the Python client's are in {@code streaming.py}, with the same arguments).
 */
public final class StreamCalls {
    private final CoordinatorClient coordinator;
    private final String stream;

    public StreamCalls(CoordinatorClient coordinator, String stream) {
        this.coordinator = coordinator;
        this.stream = stream;
    }

    public String stream() {
        return stream;
    }

    /**
     * Declare the stream as its writer query (again at each start): its Arrow schema (base64), layout, the bound on
     * what it retains ({@code maxRetainedBytes}, 0: none) and the consumer groups kept from its start.
     */
    public JsonNode declare(String schemaBase64, WriteSettings settings, long maxRetainedBytes, List<String> groups) {
        Map<String, Object> partitioner = new LinkedHashMap<>();
        partitioner.put("name", settings.partitioner());
        partitioner.put("keys", settings.keys());
        partitioner.put("custom", null);
        partitioner.put("shared", false);
        Map<String, Object> args = new LinkedHashMap<>();
        args.put("name", stream);
        args.put("schema", schemaBase64);
        args.put("num_subpartitions", settings.numSubpartitions());
        args.put("partitioner", partitioner);
        args.put("partition_type", settings.partitionType());
        args.put("coalesce", false); // the width is always given
        args.put("max_retained_bytes", maxRetainedBytes);
        args.put("groups", groups);
        if (!settings.readers().isEmpty()) {
            args.put("readers", settings.readers());
        }
        return coordinator.call("stream_declare", args);
    }

    /** The stream's description; null when no writer query declared it (after waiting up to {@code waitSeconds}). */
    public JsonNode describe(double waitSeconds) {
        try {
            return coordinator.call("stream_describe", Map.of("name", stream, "wait", waitSeconds));
        } catch (ServiceError e) {
            if (ErrorCodes.NO_EXCHANGE.equals(e.code())) {
                return null;
            }
            throw e;
        }
    }

    /** {@code {"group", "position"}} of the reader query's group (a new group starts at {@code start}). */
    public JsonNode join(String group, String start) {
        Map<String, Object> args = new HashMap<>();
        args.put("name", stream);
        args.put("group", group);
        args.put("start", start);
        return coordinator.call("stream_join", args);
    }

    /** {@code {"epoch", "last_committed"}}: the newest epoch a trigger starting after {@code after} may read. */
    public JsonNode latest(String group, long after, Integer maxEpochs, Long maxRows, Long maxBytes, Long upto,
                           double waitSeconds) {
        Map<String, Object> args = new HashMap<>();
        args.put("name", stream);
        args.put("group", group);
        args.put("after", after);
        args.put("max_epochs", maxEpochs);
        args.put("max_rows", maxRows);
        args.put("max_bytes", maxBytes);
        args.put("upto", upto);
        args.put("wait", waitSeconds);
        return coordinator.call("stream_latest", args);
    }

    /** The committed epochs in (after, upto], each with its sealed exchange's description. */
    public JsonNode plan(long after, long upto) {
        return coordinator.call("stream_plan", Map.of("name", stream, "after", after, "upto", upto));
    }

    public JsonNode commitGroup(String group, long epoch) {
        return coordinator.call("stream_commit_group", Map.of("name", stream, "group", group, "epoch", epoch));
    }

    /** The exchange of epoch {@code epoch} (being written or committed); null when it does not exist (yet). */
    public ExchangeDescription epochExchange(long epoch, double waitSeconds) {
        try {
            return ExchangeDescription.parse(coordinator.call("get_exchange",
                    Map.of("name", epochName(stream, epoch), "wait", waitSeconds)));
        } catch (ServiceError e) {
            if (ErrorCodes.NO_EXCHANGE.equals(e.code()) || ErrorCodes.EXCHANGE_LOST.equals(e.code())) {
                return null;
            }
            throw e;
        }
    }

    /** The coordinator's name of a stream's epoch exchange ({@code service/streams.py epoch_exchange}). */
    public static String epochName(String stream, long epoch) {
        return stream + "#" + epoch;
    }
}
