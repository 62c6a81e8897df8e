package org.sparkflow.exchange.format;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.coordinator.ExchangeDescription;

/** {@link Route}'s choices, for {@code UnitDriver}'s {@code route} and {@code readable} requests. */
public final class FormatProbe {
    private FormatProbe() {}

    /** {@code {"options": {..}, "write": bool}}: why the Python source serves it, or null for the JVM path. */
    public static String pythonOnly(JsonNode r) {
        Map<String, String> options = new LinkedHashMap<>();
        r.path("options").fields().forEachRemaining(e -> options.put(e.getKey(), e.getValue().asText()));
        return Route.pythonOnly(new CaseInsensitiveStringMap(options), r.path("write").asBoolean());
    }

    /**
     * {@code {"description": get_exchange's answer | null, "while_written": bool}}: why the JVM reader does not read
     * it as the Python reader does, or null when it does.
     */
    public static String unreadable(JsonNode r) {
        JsonNode d = r.path("description");
        return Route.unreadable(d.isObject() ? ExchangeDescription.parse(d) : null, r.path("while_written").asBoolean());
    }
}
