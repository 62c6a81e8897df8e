package org.sparkflow.exchange;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The launcher contract's JSON, through Jackson (on Spark's classpath): a flat object of strings
 * out; any JSON object back, its top-level fields as strings.
 */
final class Json {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    private Json() {}

    /** {@code {"k":"v",...}} with every key and value escaped. */
    static String object(Map<String, String> values) {
        try {
            return MAPPER.writeValueAsString(values);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("cannot write the launcher's settings as JSON: " + e.getMessage(), e);
        }
    }

    /**
     * A JSON object's top-level fields: strings unescaped, numbers and booleans as their literal
     * text, null as Java null, nested objects and arrays as their JSON text.
     */
    static Map<String, String> parseObject(String json) {
        JsonNode root;
        try {
            root = MAPPER.readTree(json);
        } catch (JsonProcessingException e) {
            throw new IllegalArgumentException("bad JSON (" + e.getOriginalMessage() + "): " + json, e);
        }
        if (root == null || !root.isObject()) {
            throw new IllegalArgumentException("not a JSON object: " + json);
        }
        Map<String, String> out = new LinkedHashMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = root.fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> e = it.next();
            JsonNode v = e.getValue();
            out.put(e.getKey(), v.isNull() ? null : v.isValueNode() ? v.asText() : v.toString());
        }
        return out;
    }
}
