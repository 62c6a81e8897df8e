package org.sparkflow.exchange;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import org.sparkflow.exchange.format.FormatProbe;
import org.sparkflow.exchange.read.ReadProbe;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.wire.Frames;
import org.sparkflow.exchange.wire.WireProbe;
import org.sparkflow.exchange.write.WriteProbe;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * Drives the plugin's sans-IO classes without Spark, for the unit tests in {@code tests/test_jvm_units.py} and
 * {@code tests/test_contract.py}: one JSON request per stdin line, one JSON answer per stdout line (a request that
 * throws is answered {@code {"error": "Class: message"}}).
 *
 * <ul>
 *   <li>{@code {"op": "contract"}}: every constant of the generated {@link Contract} class, by nested class</li>
 *   <li>{@code {"op": "fields", "fields": ["pkg.Class#FIELD", ...]}}: the values of static fields (any visibility,
 *       or public and inherited)</li>
 *   <li>{@code {"op": "encode", "type": n, "header": "text" | "header_hex": "..", "payload_length": k}}: {@link Frames#encode}</li>
 *   <li>{@code {"op": "decode", "hex": "..", "chunk": k, "max_frame": m, "land": t, "direct": d}}: the frames a
 *       {@link Frames.Decoder} fed k bytes at a time returns, or the error it throws (payloads of frames of type t
 *       landed in direct memory; payloads with at least d bytes due read straight into their target)</li>
 *   <li>{@code {"op": "spill", "index": path, "subpartition": s, "data_size": n}}: {@code SpillIndex.entries} or its error</li>
 *   <li>{@code {"op": "epoch_marker", "epoch": e}}: the JVM stream sink's epoch marker, hex</li>
 *   <li>{@code {"op": "stream_offset", "stream": s, "json": ".."}}: a checkpoint's offset parsed and written again</li>
 *   <li>{@code {"op": "parse", "kind": "size" | "duration", "values": [..]}}: each value as {@link WriteSettings#parseSize}
 *       (bytes) or {@link WriteSettings#parseSeconds} (seconds) reads it, or {@code {"error": ..}}</li>
 *   <li>{@code {"op": "write_options", "options": {..}}}: {@link WriteSettings#defaults} with the options applied and
 *       checked, or the error</li>
 *   <li>{@code handshake}, {@code live}, {@code key_filter}, {@code read_partitions}, {@code write_settings},
 *       {@code route}, {@code readable}, {@code encode_rows}, {@code encode_batches}, {@code push_stage}: {@code Handshake}, {@code LiveProducers},
 *       {@code KeyFilter}, {@code ReadLayout}, {@code WriteSettings} and {@code Route} through the probe of their
 *       package ({@code wire.WireProbe}, {@code read.ReadProbe}, {@code write.WriteProbe}, {@code format.FormatProbe}),
 *       whose javadoc gives each request's fields</li>
 *   <li>{@code {"op": "standalone_read", "describe": "..", "subpartition": s (or "subpartitions": [..]), "coordinator": a, "secret": k,
 *       "host_id": h, "columns": [..]}}: {@code read.StandaloneRead#read} against real services, hex</li>
 *   <li>{@code remote_read}: one producer's subpartition (or several at once) through {@code read.RemoteProducer}, paused mid-read
 *       ({@code read.ReadProbe#remoteRead})</li>
 *   <li>{@code decode_buffers}: data buffers loaded one after another by {@code read.BufferDecoder}
 *       ({@code read.ReadProbe#decodeBuffers})</li>
 *   <li>{@code real_time_read}: a Real-time Mode read task against real services ({@code stream.StreamProbe})</li>
 *   <li>{@code zstd_context}: the writer's ZSTD codec against Arrow's own ({@code codec.CodecProbe})</li>
 *   <li>{@code partition_request}: a {@code read.CreditReceiver}'s request, a resumed one included, and the buffers
 *       it accepts after it ({@link #partitionRequest})</li>
 * </ul>
 */
public final class UnitDriver {
    private static final ObjectMapper JSON = new ObjectMapper();

    private UnitDriver() {}

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            if (line.isBlank()) {
                continue;
            }
            JsonNode request = JSON.readTree(line);
            ObjectNode answer = JSON.createObjectNode();
            try {
                switch (request.path("op").asText()) {
                    case "contract" -> answer.set("contract", contract());
                    case "fields" -> answer.set("fields", fields(request.path("fields")));
                    case "encode" -> answer.put("hex", encode(request));
                    case "decode" -> answer.set("frames", decode(request));
                    case "spill" -> answer.set("entries", spill(request));
                    case "epoch_marker" -> answer.put("hex", epochMarker(request.path("epoch").asLong()));
                    case "stream_offset" -> answer.put("json", org.sparkflow.exchange.stream.StreamOffset.parse(
                            request.path("stream").asText(), request.path("json").asText()).json());
                    case "parse" -> answer.set("results", parse(request));
                    case "write_options" -> answer.set("settings", writeSettings(request));
                    case "handshake" -> answer.set("handshake", WireProbe.handshake(request));
                    case "live" -> answer.set("results", ReadProbe.live(request));
                    case "key_filter" -> answer.set("filter", ReadProbe.keyFilter(request));
                    case "read_partitions" -> answer.set("partitions", ReadProbe.readPartitions(request));
                    case "write_settings" -> answer.set("settings", WriteProbe.settings(request));
                    case "encode_rows" -> answer.put("hex", WriteProbe.encodeRows(request));
                    case "encode_typed" -> answer.setAll((ObjectNode) WriteProbe.encodeTyped(request));
                    case "route_keys" -> answer.set("routed", WriteProbe.routeKeys(request));
                    case "encode_batches" -> answer.setAll(request.path("background").asBoolean(false)
                            ? WriteProbe.encodeBatchesInBackground(request) : WriteProbe.encodeBatches(request));
                    case "push_stage" -> answer.setAll(WriteProbe.pushStage(request));
                    case "zstd_context" -> answer.setAll(org.sparkflow.exchange.codec.CodecProbe.zstdContext(request));
                    case "route" -> answer.put("python_only", FormatProbe.pythonOnly(request));
                    case "readable" -> answer.put("unreadable", FormatProbe.unreadable(request));
                    case "real_time" -> answer.put("unavailable", org.sparkflow.exchange.stream.StreamTable
                            .realTimeUnavailable(request.path("interface").asText()));
                    case "warmup" -> warmup(answer);
                    case "standalone_read" -> answer.put("hex", standaloneRead(request));
                    case "remote_read" -> answer.set("values", ReadProbe.remoteRead(request));
                    case "decode_buffers" -> answer.set("buffers", ReadProbe.decodeBuffers(request));
                    case "partition_request" -> answer.setAll(partitionRequest(request));
                    case "real_time_read" -> answer.setAll(org.sparkflow.exchange.stream.StreamProbe.realTimeRead(request));
                    default -> throw new IllegalArgumentException("unknown op " + request.path("op"));
                }
            } catch (RuntimeException e) {
                answer.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            System.out.println(JSON.writeValueAsString(answer));
        }
    }

    /**
     * {@code {"op": "partition_request", "partition": p, "subpartition": s, "receiver": r, "credit": c,
     * "resume_at": n (optional), "buffers": ["hex", ..]}}: the {@code CreditReceiver}'s request (a resume at n when
     * given), hex, then what it makes of each BUFFER_RESPONSE frame: its sequence number, or the error.
     */
    private static ObjectNode partitionRequest(JsonNode r) {
        var receiver = new org.sparkflow.exchange.read.CreditReceiver(r.path("receiver").asLong(),
                r.path("credit").asInt());
        String partition = r.path("partition").asText();
        int sub = r.path("subpartition").asInt();
        ObjectNode out = JSON.createObjectNode();
        out.put("hex", HexFormat.of().formatHex(r.has("resume_at")
                ? receiver.resumeAt(partition, sub, r.path("resume_at").asLong()) : receiver.request(partition, sub)));
        ArrayNode got = out.putArray("buffers");
        for (JsonNode b : r.path("buffers")) {
            byte[] bytes = HexFormat.of().parseHex(b.asText());
            try {
                got.add(receiver.onBuffer(new Frames.Decoder(Contract.Frame.MAX_FRAME).feed(bytes, bytes.length).get(0)).seq());
            } catch (RuntimeException e) {
                got.add(e.getClass().getSimpleName() + ": " + e.getMessage());
            }
        }
        return out;
    }

    private static String standaloneRead(JsonNode r) throws java.io.IOException {
        JsonNode cols = r.path("columns");
        int[] columns = new int[cols.size()];
        for (int i = 0; i < columns.length; i++) {
            columns[i] = cols.get(i).asInt();
        }
        int[] subpartitions = r.has("subpartitions")
                ? java.util.stream.StreamSupport.stream(r.path("subpartitions").spliterator(), false)
                        .mapToInt(JsonNode::asInt).toArray()
                : new int[] {r.path("subpartition").asInt()};
        return HexFormat.of().formatHex(org.sparkflow.exchange.read.StandaloneRead.read(r.path("describe").asText(),
                subpartitions, r.path("coordinator").asText(), r.path("secret").asText(),
                r.path("host_id").asText(), columns));
    }

    private static String epochMarker(long epoch) throws ReflectiveOperationException {
        Method m = Class.forName("org.sparkflow.exchange.stream.StreamSink").getDeclaredMethod("epochMarker", long.class);
        m.setAccessible(true);
        return HexFormat.of().formatHex((byte[]) m.invoke(null, epoch));
    }

    /** The write path's warm-up, which a session runs on a daemon thread that swallows its failures: here they show. */
    private static void warmup(ObjectNode answer) {
        long started = System.nanoTime();
        long[] made;
        try {
            made = org.sparkflow.exchange.write.Warmup.warm();
        } catch (Exception e) {
            throw new IllegalStateException("the warm-up failed: " + e, e);
        }
        answer.put("ms", (System.nanoTime() - started) / 1_000_000);
        answer.put("buffers", made[0]);
        answer.put("rows", made[1]);
    }

    private static ObjectNode contract() throws IllegalAccessException {
        ObjectNode out = JSON.createObjectNode();
        for (Class<?> nested : Contract.class.getDeclaredClasses()) {
            ObjectNode values = out.putObject(nested.getSimpleName());
            for (Field f : nested.getDeclaredFields()) {
                if (Modifier.isStatic(f.getModifiers())) {
                    values.set(f.getName(), value(f.get(null)));
                }
            }
        }
        return out;
    }

    private static ObjectNode fields(JsonNode names) throws ReflectiveOperationException {
        ObjectNode out = JSON.createObjectNode();
        for (JsonNode name : names) {
            String[] parts = name.asText().split("#");
            Class<?> owner = Class.forName(parts[0]);
            Field f;
            try {
                f = owner.getDeclaredField(parts[1]);
            } catch (NoSuchFieldException e) {
                f = owner.getField(parts[1]); // a public field it inherits (ErrorCodes' codes)
            }
            f.setAccessible(true);
            out.set(name.asText(), value(f.get(null)));
        }
        return out;
    }

    /** A constant as JSON: numbers and strings as they are, bytes as ASCII text, a set as a sorted list. */
    private static JsonNode value(Object v) {
        if (v instanceof byte[] bytes) {
            return JSON.getNodeFactory().textNode(new String(bytes, StandardCharsets.US_ASCII));
        }
        if (v instanceof Collection<?> items) {
            ArrayNode list = JSON.createArrayNode();
            Collection<?> ordered = items instanceof List<?> ? items : new TreeSet<>(items);
            ordered.forEach(item -> list.add(value(item)));
            return list;
        }
        return JSON.valueToTree(v);
    }

    private static String encode(JsonNode r) {
        byte[] header = r.has("header_hex") ? HexFormat.of().parseHex(r.path("header_hex").asText())
                : r.path("header").asText().getBytes(StandardCharsets.UTF_8);
        return HexFormat.of().formatHex(Frames.encode(r.path("type").asInt(), header, r.path("payload_length").asInt(0)));
    }

    private static ArrayNode decode(JsonNode r) {
        byte[] data = HexFormat.of().parseHex(r.path("hex").asText());
        int chunk = Math.max(1, r.path("chunk").asInt(data.length == 0 ? 1 : data.length));
        Frames.Decoder decoder = new Frames.Decoder(r.path("max_frame").asInt(Contract.Frame.MAX_FRAME));
        int[] open = {0}; // landings made and not closed
        int direct = r.path("direct").asInt(0); // payloads with at least this many bytes due are read straight in
        if (r.path("land").asInt(-1) >= 0) { // payloads of frames of this type land in direct memory
            int type = r.path("land").asInt();
            decoder.sink((t, header, length) -> t != type ? null : new Frames.Landing() {
                private final ByteBuffer bytes = ByteBuffer.allocateDirect(length);
                { open[0]++; }

                @Override
                public ByteBuffer bytes() {
                    return bytes.duplicate().clear();
                }

                @Override
                public void close() {
                    open[0]--;
                }
            });
        }
        List<Frames.Frame> frames = new ArrayList<>();
        for (int pos = 0; pos < data.length; ) {
            int n = Math.min(chunk, data.length - pos);
            ByteBuffer target = direct > 0 ? decoder.payloadTarget(direct) : null;
            if (target != null) { // as a connection reads the socket into it: n bytes or what is due
                n = Math.min(n, target.remaining());
                target.put(data, pos, n);
                Frames.Frame done = decoder.filled(n);
                if (done != null) {
                    frames.add(done);
                }
            } else {
                byte[] piece = new byte[n];
                System.arraycopy(data, pos, piece, 0, n);
                frames.addAll(decoder.feed(piece, n));
            }
            pos += n;
        }
        ArrayNode out = JSON.createArrayNode();
        for (Frames.Frame f : frames) {
            byte[] payload = f.payload();
            if (f.landed() != null) {
                ByteBuffer b = f.landed().bytes();
                payload = new byte[b.remaining()];
                b.get(payload);
                f.landed().close();
            }
            out.addObject().put("type", f.type()).put("header", f.headerText())
                    .put("header_hex", HexFormat.of().formatHex(f.header()))
                    .put("payload", HexFormat.of().formatHex(payload)).put("landed", f.landed() != null);
        }
        decoder.release();
        if (open[0] != 0) {
            throw new IllegalStateException(open[0] + " landings left open");
        }
        return out;
    }

    private static ArrayNode parse(JsonNode r) {
        boolean size = "size".equals(r.path("kind").asText());
        ArrayNode out = JSON.createArrayNode();
        for (JsonNode v : r.path("values")) {
            try {
                if (size) {
                    out.add(WriteSettings.parseSize(v.asText()));
                } else {
                    out.add(WriteSettings.parseSeconds(v.asText()));
                }
            } catch (IllegalArgumentException e) {
                out.addObject().put("error", e.getMessage());
            }
        }
        return out;
    }

    private static JsonNode writeSettings(JsonNode r) {
        Map<String, String> options = JSON.convertValue(r.path("options"),
                JSON.getTypeFactory().constructMapType(java.util.HashMap.class, String.class, String.class));
        return JSON.valueToTree(WriteSettings.defaults().with(List.of(options)).checked());
    }

    private static ArrayNode spill(JsonNode r) throws Exception {
        byte[] index = Files.readAllBytes(Path.of(r.path("index").asText()));
        Method entries = Class.forName("org.sparkflow.exchange.read.SpillIndex")
                .getMethod("entries", byte[].class, int.class, long.class);
        List<?> found;
        try {
            found = (List<?>) entries.invoke(null, index, r.path("subpartition").asInt(), r.path("data_size").asLong());
        } catch (java.lang.reflect.InvocationTargetException e) {
            throw (RuntimeException) e.getCause();
        }
        ArrayNode out = JSON.createArrayNode();
        for (Object e : found) {
            out.add(JSON.valueToTree(e)); // a record: seq, offset, length, kind, flags
        }
        return out;
    }
}
