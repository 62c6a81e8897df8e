package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.TreeMap;
import org.sparkflow.exchange.read.ReadSettings;

/** The stream package's Real-time Mode reader for {@code UnitDriver}, without Spark, against real services. */
public final class StreamProbe {
    private static final ObjectMapper JSON = new ObjectMapper();

    private StreamProbe() {}

    /**
     * {@code {"op": "real_time_read", "stream": s, "schema": base64, "offset": checkpoint offset JSON, "rows": n,
     * "coordinator": a, "secret": k, "host_id": h, "timeout_ms": t}}: one Real-time Mode read task of subpartition 0
     * from the offset's place (as the next batch's task starts from the last one's), the first column (a long) of
     * the next n rows it returns (fewer when t ms pass), then its offset as the checkpoint holds it.
     */
    public static ObjectNode realTimeRead(JsonNode r) throws IOException {
        String stream = r.path("stream").asText();
        StreamOffset start = StreamOffset.parse(stream, r.path("offset").asText());
        StreamOffset.Position from = start.subpartitions != null && start.subpartitions.containsKey(0)
                ? start.subpartitions.get(0) : StreamOffset.Position.start(start.epoch + 1);
        ReadSettings settings = new ReadSettings(r.path("host_id").asText(), r.path("secret").asText(),
                r.path("coordinator").asText(), false, null);
        RealTimeReader reader = new RealTimeReader(new RealTimeReader.Input(stream, 0, from, r.path("schema").asText(),
                new int[] {0}, settings));
        ObjectNode out = JSON.createObjectNode();
        ArrayNode ids = out.putArray("ids");
        try {
            long deadline = System.nanoTime() + r.path("timeout_ms").asLong(60_000) * 1_000_000L;
            while (ids.size() < r.path("rows").asInt() && System.nanoTime() < deadline) {
                long left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000L);
                if (reader.nextWithTimeout(left).hasRecord()) {
                    ids.add(reader.get().getLong(0));
                }
            }
            StreamOffset.Position at = ((RealTimeReader.SubpartitionOffset) reader.getOffset()).position();
            TreeMap<Integer, StreamOffset.Position> subs = new TreeMap<>();
            subs.put(0, at);
            out.put("offset", new StreamOffset(stream, at.epoch() - 1, start.group, subs).json());
        } finally {
            reader.close();
        }
        return out;
    }
}
