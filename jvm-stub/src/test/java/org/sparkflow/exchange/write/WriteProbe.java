package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** {@link WriteSettings}' parsing, for {@code UnitDriver}'s {@code write_settings}. */
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
}
