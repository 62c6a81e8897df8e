package org.sparkflow.exchange.read;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.List;
import java.util.SortedSet;
import java.util.TreeSet;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.LiteralValue;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;

/** The read package's sans-IO classes, for {@code UnitDriver}'s {@code live}, {@code key_filter}, {@code read_partitions}. */
public final class ReadProbe {
    private static final ObjectMapper JSON = new ObjectMapper();

    private ReadProbe() {}

    /**
     * {@code {"exchange": e, "epoch": n, "seal": s, "steps": [{"do": ..}, ..]}}: a {@link LiveProducers} taken through
     * the steps ({@code update} with a {@code description}; {@code next}; {@code finished} and {@code dropped} with a
     * {@code partition} and {@code rows}; {@code complete}; {@code started}; {@code not_committed});
     * one result per step, the last an {@code {"error": ..}} when a step threw (the rest are not taken).
     */
    public static ArrayNode live(JsonNode r) {
        LiveProducers live = new LiveProducers(r.path("exchange").asText(), r.path("epoch").asLong(),
                r.path("seal").asInt());
        ArrayNode out = JSON.createArrayNode();
        for (JsonNode step : r.path("steps")) {
            Producer p = new Producer(0, step.path("partition").asText(), "", "", "", -1, "", "", false);
            long rows = step.path("rows").asLong();
            try {
                switch (step.path("do").asText()) {
                    case "update" -> {
                        live.update(ExchangeDescription.parse(step.path("description")));
                        out.addNull();
                    }
                    case "next" -> {
                        Producer next = live.next();
                        out.add(next == null ? null : next.partition());
                    }
                    case "finished" -> {
                        live.finished(p, rows);
                        out.addNull();
                    }
                    case "dropped" -> out.add(live.dropped(p, rows));
                    case "complete" -> out.add(live.complete());
                    case "started" -> out.add(live.started());
                    case "not_committed" -> out.add(live.notCommitted());
                    default -> throw new IllegalArgumentException("unknown step " + step);
                }
            } catch (RuntimeException e) {
                out.addObject().put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                break;
            }
        }
        return out;
    }

    /**
     * {@code {"columns": [[name, type], ..], "keys": [..], "n": width, "predicates": [[op, column, [values..],
     * literal type (else the column's), reversed]]}} (types: int, long, string, double): the subpartitions a
     * {@link KeyFilter} keeps (null: every one) and how many predicates it used.
     */
    public static ObjectNode keyFilter(JsonNode r) {
        List<StructField> fields = new ArrayList<>();
        for (JsonNode c : r.path("columns")) {
            fields.add(DataTypes.createStructField(c.get(0).asText(), type(c.get(1).asText()), true));
        }
        StructType schema = new StructType(fields.toArray(new StructField[0]));
        List<String> keys = new ArrayList<>();
        r.path("keys").forEach(k -> keys.add(k.asText()));
        KeyFilter filter = new KeyFilter(schema, keys);
        for (JsonNode p : r.path("predicates")) {
            String column = p.get(1).asText();
            String typeName = p.has(3) && !p.get(3).isNull() ? p.get(3).asText()
                    : typeName(schema.fields()[schema.fieldIndex(column)].dataType());
            List<Expression> children = new ArrayList<>();
            children.add(Expressions.column(column));
            for (JsonNode v : p.get(2)) {
                children.add(literal(v, typeName));
            }
            if (p.has(4) && p.get(4).asBoolean()) {
                java.util.Collections.reverse(children);
            }
            filter.offer(new Predicate(p.get(0).asText(), children.toArray(new Expression[0])));
        }
        ObjectNode out = JSON.createObjectNode();
        SortedSet<Integer> kept = filter.subpartitions(r.path("n").asInt());
        if (kept == null) {
            out.putNull("subpartitions");
        } else {
            ArrayNode list = out.putArray("subpartitions");
            kept.forEach(list::add);
        }
        out.put("used", filter.used().length);
        return out;
    }

    private static DataType type(String name) {
        return switch (name) {
            case "int" -> DataTypes.IntegerType;
            case "long" -> DataTypes.LongType;
            case "string" -> DataTypes.StringType;
            case "double" -> DataTypes.DoubleType;
            default -> throw new IllegalArgumentException("unknown type " + name);
        };
    }

    private static String typeName(DataType t) {
        for (String name : List.of("int", "long", "string", "double")) {
            if (type(name).equals(t)) {
                return name;
            }
        }
        throw new IllegalArgumentException("no name for " + t);
    }

    /** A literal as Spark pushes one down: the value in Spark's internal form (strings as UTF8String). */
    private static LiteralValue<?> literal(JsonNode v, String typeName) {
        DataType t = type(typeName);
        if (v.isNull()) {
            return new LiteralValue<>(null, t);
        }
        return switch (typeName) {
            case "int" -> new LiteralValue<>(v.asInt(), t);
            case "long" -> new LiteralValue<>(v.asLong(), t);
            case "string" -> new LiteralValue<>(UTF8String.fromString(v.asText()), t);
            default -> new LiteralValue<>(v.asDouble(), t);
        };
    }

    /**
     * {@code {"exchange": e, "n": width, "kept": [..] (else all), "requested": readPartitions, "key_grouped": bool,
     * "broadcast": bool, "shared": bool, "live": bool, "slots": task slots}}: the read partitions {@link ReadLayout}
     * plans, each a list of subpartitions ({@code live}: planned while the exchange is written).
     */
    public static ArrayNode readPartitions(JsonNode r) {
        int n = r.path("n").asInt();
        SortedSet<Integer> kept = new TreeSet<>();
        if (r.has("kept")) {
            r.path("kept").forEach(i -> kept.add(i.asInt()));
        } else {
            for (int i = 0; i < n; i++) {
                kept.add(i);
            }
        }
        String requested = r.path("requested").isTextual() ? r.path("requested").asText() : null;
        ReadLayout layout = r.path("broadcast").asBoolean()
                ? ReadLayout.copies(r.path("exchange").asText(), n, requested, r.path("shared").asBoolean())
                : ReadLayout.plan(r.path("exchange").asText(), n, kept, null, requested,
                        r.path("key_grouped").asBoolean(), r.path("live").asBoolean(), r.path("slots").asInt(1));
        ArrayNode out = JSON.createArrayNode();
        for (int[] members : layout.members()) {
            ArrayNode group = out.addArray();
            for (int i : members) {
                group.add(i);
            }
        }
        return out;
    }

    /**
     * {@code {"describe": json, "partition": p, "subpartition": s (or "subpartitions": [..]), "secret": k, "host_id": h, "after": n, "mid": path,
     * "go": path}}: one producer's subpartition (or several at once) read by {@link RemoteProducer} (what a read task does with a producer on
     * another host), column 0 as longs; after {@code after} data buffers it creates the file {@code mid} and waits (at
     * most two minutes) for the file {@code go} before it reads on. Answers the values read, in order.
     */
    public static ArrayNode remoteRead(JsonNode r) throws Exception {
        ExchangeDescription desc = ExchangeDescription.parse(JSON.readTree(r.path("describe").asText()));
        Producer p = desc.registered.stream().filter(x -> x.partition().equals(r.path("partition").asText()))
                .findFirst().orElseThrow();
        ArrayNode out = JSON.createArrayNode();
        try (org.apache.arrow.memory.BufferAllocator allocator = new org.apache.arrow.memory.RootAllocator()) {
            org.apache.arrow.vector.types.pojo.Schema schema = org.apache.arrow.vector.ipc.message.MessageSerializer
                    .deserializeSchema(new org.apache.arrow.vector.ipc.ReadChannel(java.nio.channels.Channels.newChannel(
                            new java.io.ByteArrayInputStream(java.util.Base64.getDecoder().decode(desc.schemaBase64)))));
            try (org.apache.arrow.vector.VectorSchemaRoot root = org.apache.arrow.vector.VectorSchemaRoot.create(schema,
                    allocator); BufferDecoder decoder = new BufferDecoder(allocator, root)) {
                java.nio.file.Path mid = java.nio.file.Path.of(r.path("mid").asText());
                java.nio.file.Path go = java.nio.file.Path.of(r.path("go").asText());
                int[] subpartitions = r.has("subpartitions")
                        ? java.util.stream.StreamSupport.stream(r.path("subpartitions").spliterator(), false)
                                .mapToInt(JsonNode::asInt).toArray()
                        : new int[] {r.path("subpartition").asInt()};
                try (RemoteProducer source = new RemoteProducer(p, p.tcp(), subpartitions,
                        r.path("secret").asText(), r.path("host_id").asText(), null)) {
                    int buffers = 0;
                    for (int rows = source.next(decoder); rows >= 0; rows = source.next(decoder)) {
                        org.apache.arrow.vector.BigIntVector ids = (org.apache.arrow.vector.BigIntVector) root.getVector(0);
                        for (int i = 0; i < rows; i++) {
                            out.add(ids.get(i));
                        }
                        if (++buffers == r.path("after").asInt()) {
                            java.nio.file.Files.writeString(mid, "reading");
                            long deadline = System.nanoTime() + 120_000_000_000L;
                            while (!java.nio.file.Files.exists(go) && System.nanoTime() < deadline) {
                                Thread.sleep(20);
                            }
                        }
                    }
                    String mismatch = source.countsMismatch();
                    if (mismatch != null) {
                        throw new IllegalStateException(mismatch);
                    }
                }
            }
        }
        return out;
    }
    /**
     * {@code {"schema": base64 IPC schema, "hex": ["..", ..]}}: data buffers loaded one after another into one root by
     * {@link BufferDecoder} (as a read task loads a subpartition's), each answered with its columns' values as text
     * (null for a null) and its columns' null counts, or the error its load threw.
     */
    public static ArrayNode decodeBuffers(JsonNode r) throws Exception {
        ArrayNode out = JSON.createArrayNode();
        try (org.apache.arrow.memory.BufferAllocator allocator = new org.apache.arrow.memory.RootAllocator()) {
            org.apache.arrow.vector.types.pojo.Schema schema = org.apache.arrow.vector.ipc.message.MessageSerializer
                    .deserializeSchema(new org.apache.arrow.vector.ipc.ReadChannel(java.nio.channels.Channels.newChannel(
                            new java.io.ByteArrayInputStream(java.util.Base64.getDecoder().decode(
                                    r.path("schema").asText())))));
            try (org.apache.arrow.vector.VectorSchemaRoot root = org.apache.arrow.vector.VectorSchemaRoot.create(schema,
                    allocator); BufferDecoder decoder = new BufferDecoder(allocator, root)) {
                for (JsonNode h : r.path("hex")) {
                    ObjectNode one = out.addObject();
                    try {
                        int rows = decoder.load(java.util.HexFormat.of().parseHex(h.asText()));
                        ArrayNode columns = one.putArray("columns");
                        ArrayNode nulls = one.putArray("nulls");
                        for (org.apache.arrow.vector.FieldVector v : root.getFieldVectors()) {
                            ArrayNode values = columns.addArray();
                            for (int i = 0; i < rows; i++) {
                                Object value = v.getObject(i);
                                if (value == null) {
                                    values.addNull();
                                } else {
                                    values.add(String.valueOf(value));
                                }
                            }
                            nulls.add(v.getNullCount());
                        }
                    } catch (BufferDecoder.CorruptBuffer | RuntimeException e) {
                        one.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                    }
                }
            }
        }
        return out;
    }
}
