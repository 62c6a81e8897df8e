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
 * for its {@code encode_rows}.
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
