package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * {@link WriteSettings}' parsing, for {@code UnitDriver}'s {@code write_settings}; {@link BufferEncoder}'s buffers,
 * for its {@code encode_rows} and {@code encode_batches}.
 */
public final class WriteProbe {
    private static final ObjectMapper JSON = new ObjectMapper();

    private WriteProbe() {}

    /**
     * {@code {"layers": [{key: value}, ...], "checked": bool}}: the defaults with the layers applied over them (and
     * {@link WriteSettings#checked}), as JSON; an IllegalArgumentException's message otherwise.
     */
    public static JsonNode settings(JsonNode r) {
        List<Map<String, String>> layers = new ArrayList<>();
        for (JsonNode layer : r.path("layers")) {
            Map<String, String> options = new LinkedHashMap<>();
            layer.fields().forEachRemaining(e -> options.put(e.getKey(), e.getValue().asText()));
            layers.add(options);
        }
        WriteSettings s = WriteSettings.defaults().with(layers);
        if (r.path("checked").asBoolean(false)) {
            s = s.checked();
        }
        ObjectNode out = JSON.valueToTree(s);
        out.put("single", s.single());
        return out;
    }

    /**
     * {@code {"compression": c, "batches": [[kind, rows], ...]}}: one writer's buffers of a long column {@code l}, in
     * order, through one {@link BufferEncoder} (as a write task encodes them), hex each; kind {@code "noise"}:
     * SplitMix64 of {@code 1000003 * batch index + row} (incompressible), {@code "count"}: 0..rows-1. With {@code "attempts"}: the codec's
     * compressions after each buffer.
     */
    public static ObjectNode encodeBatches(JsonNode r) {
        org.apache.spark.sql.types.StructType rows = new org.apache.spark.sql.types.StructType()
                .add("l", org.apache.spark.sql.types.DataTypes.LongType);
        org.apache.arrow.vector.compression.CompressionCodec codec =
                org.sparkflow.exchange.codec.Codecs.forName(r.path("compression").asText("none"));
        ObjectNode out = JSON.createObjectNode();
        com.fasterxml.jackson.databind.node.ArrayNode hex = out.putArray("hex");
        com.fasterxml.jackson.databind.node.ArrayNode attempts = out.putArray("attempts");
        try (BufferEncoder encoder = new BufferEncoder(
                org.apache.spark.sql.util.ArrowUtils.toArrowSchema(rows, "UTC", false, false, false), rows, 1, codec)) {
            int index = 0;
            for (JsonNode b : r.path("batches")) {
                String kind = b.get(0).asText();
                int n = b.get(1).asInt();
                long seed = 1_000_003L * index++;
                for (long i = 0; i < n; i++) {
                    long v = kind.equals("noise") ? splitMix64(seed + i) : i;
                    encoder.append(0, new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(new Object[]{v}));
                }
                hex.add(java.util.HexFormat.of().formatHex(encoder.encode(0, 8L * n, n)));
                attempts.add(codec instanceof org.sparkflow.exchange.codec.StoredWhenLarger s ? s.attempts() : 0);
            }
        }
        return out;
    }

    /** SplitMix64's output for {@code x}: well-mixed bits a test can compute too. */
    static long splitMix64(long x) {
        long z = x * 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    /**
     * {@code {"rows": n, "compression": c, "interrupted": bool}}: one buffer of the longs 0..n-1 (column {@code l}),
     * hex, encoded as a task encodes it (with its thread's interrupt flag set when asked: a flush must not fail or
     * lose its rows for it); the flag is cleared after.
     */
    public static String encodeRows(JsonNode r) {
        org.apache.spark.sql.types.StructType rows = new org.apache.spark.sql.types.StructType()
                .add("l", org.apache.spark.sql.types.DataTypes.LongType);
        int n = r.path("rows").asInt();
        try (BufferEncoder encoder = new BufferEncoder(
                org.apache.spark.sql.util.ArrowUtils.toArrowSchema(rows, "UTC", false, false, false), rows, 1,
                org.sparkflow.exchange.codec.Codecs.forName(r.path("compression").asText("none")))) {
            for (long i = 0; i < n; i++) {
                encoder.append(0, new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(new Object[]{i}));
            }
            if (r.path("interrupted").asBoolean(false)) {
                Thread.currentThread().interrupt();
            }
            try {
                return java.util.HexFormat.of().formatHex(encoder.encode(0, 8L * n, n));
            } finally {
                Thread.interrupted();
            }
        }
    }
}
