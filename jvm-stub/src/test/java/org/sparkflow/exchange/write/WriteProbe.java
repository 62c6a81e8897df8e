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
        org.apache.arrow.vector.compression.CompressionCodec codec =
                org.sparkflow.exchange.codec.Codecs.forName(r.path("compression").asText("none"));
        ObjectNode out = JSON.createObjectNode();
        com.fasterxml.jackson.databind.node.ArrayNode hex = out.putArray("hex");
        com.fasterxml.jackson.databind.node.ArrayNode attempts = out.putArray("attempts");
        try (BufferEncoder encoder = longColumnEncoder(codec)) {
            int index = 0;
            for (JsonNode b : r.path("batches")) {
                int n = appendBatch(encoder, b, index++);
                hex.add(java.util.HexFormat.of().formatHex(encoder.encode(0, 8L * n, n)));
                attempts.add(codec instanceof org.sparkflow.exchange.codec.StoredWhenLarger s ? s.attempts() : 0);
            }
        }
        return out;
    }

    /**
     * {@code {"compression": c, "batches": [[kind, rows], ...]}} as {@link #encodeBatches} makes them, but every
     * buffer detached as a write task detaches it and encoded on a background {@link PushStage} (queue bound
     * {@code "max_bytes"}): the buffers in the order they were pushed, hex, and the threads that encoded them.
     */
    public static ObjectNode encodeBatchesInBackground(JsonNode r) {
        org.apache.arrow.vector.compression.CompressionCodec codec =
                org.sparkflow.exchange.codec.Codecs.forName(r.path("compression").asText("none"));
        ObjectNode out = JSON.createObjectNode();
        com.fasterxml.jackson.databind.node.ArrayNode hex = out.putArray("hex");
        java.util.Set<String> threads = new java.util.TreeSet<>();
        List<Integer> subs = new ArrayList<>();
        try (BufferEncoder encoder = longColumnEncoder(codec)) {
            PushStage stage = new PushStage(PROBE_THREAD, (sub, payload, flags) -> {
                synchronized (hex) {
                    hex.add(java.util.HexFormat.of().formatHex(payload));
                    subs.add(sub);
                    threads.add(Thread.currentThread().getName());
                }
            }, r.path("max_bytes").asLong(1 << 20), true);
            int index = 0;
            for (JsonNode b : r.path("batches")) {
                int n = appendBatch(encoder, b, index);
                BufferEncoder.Detached d = encoder.detach(0, n);
                stage.submit(index++, 0, d.bytes(), d);
            }
            stage.drain();
            stage.stop();
            out.put("ended", stage.awaitEnd(10_000));
        }
        synchronized (hex) {
            out.set("subpartitions", JSON.valueToTree(subs));
            out.set("threads", JSON.valueToTree(threads));
        }
        out.put("caller", Thread.currentThread().getName());
        return out;
    }

    /** An encoder of one target for the probes' one long column {@code l}. */
    private static BufferEncoder longColumnEncoder(org.apache.arrow.vector.compression.CompressionCodec codec) {
        org.apache.spark.sql.types.StructType rows = new org.apache.spark.sql.types.StructType()
                .add("l", org.apache.spark.sql.types.DataTypes.LongType);
        return new BufferEncoder(
                org.apache.spark.sql.util.ArrowUtils.toArrowSchema(rows, "UTC", false, false, false), rows, 1, codec);
    }

    /**
     * Append batch {@code index} ({@code [kind, rows]}) to target 0: kind {@code "noise"}: SplitMix64 of
     * {@code 1000003 * index + row}, else 0..rows-1; its rows.
     */
    private static int appendBatch(BufferEncoder encoder, JsonNode batch, int index) {
        String kind = batch.get(0).asText();
        int n = batch.get(1).asInt();
        long seed = 1_000_003L * index;
        for (long i = 0; i < n; i++) {
            long v = kind.equals("noise") ? splitMix64(seed + i) : i;
            encoder.append(0, new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(new Object[]{v}));
        }
        return n;
    }

    static final String PROBE_THREAD = "sparkflow-exchange-push-probe";

    /** The probe's push threads still alive (a stage that ended leaves none). */
    private static long probeThreads() {
        return Thread.getAllStackTraces().keySet().stream()
                .filter(t -> t.getName().equals(PROBE_THREAD) && t.isAlive()).count();
    }

    /** A job of the probe: {@code encode} gives its index as 4 bytes, counted; {@code discard} counted. */
    private static final class Numbered implements PushStage.Job {
        final int index;
        final java.util.concurrent.atomic.AtomicInteger encoded;
        final java.util.concurrent.atomic.AtomicInteger discarded;

        Numbered(int index, java.util.concurrent.atomic.AtomicInteger encoded,
                 java.util.concurrent.atomic.AtomicInteger discarded) {
            this.index = index;
            this.encoded = encoded;
            this.discarded = discarded;
        }

        @Override
        public byte[] encode() {
            encoded.incrementAndGet();
            if (index % 3 == 0) {
                Thread.yield(); // unequal encoding times
            }
            return java.nio.ByteBuffer.allocate(4).putInt(index).array();
        }

        @Override
        public void discard() {
            discarded.incrementAndGet();
        }
    }

    private static int indexOf(byte[] payload) {
        return java.nio.ByteBuffer.wrap(payload).getInt();
    }

    /** Wait (bounded: 20 s) until {@code done} holds; whether it did. */
    private static boolean within(java.util.function.BooleanSupplier done) throws InterruptedException {
        long until = System.nanoTime() + 20_000_000_000L;
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > until) {
                return false;
            }
            Thread.sleep(1);
        }
        return true;
    }

    /**
     * {@code {"scenario": s}}: a {@link PushStage} with a background worker, without Spark or a service (its sink
     * records what reaches it, in order). {@code order}: 200 buffers to 7 subpartitions pushed as handed over, on the
     * worker. {@code backpressure}: a queue of 300 bytes and a sink held on its first buffer: a task handing over
     * 100-byte buffers waits after the third, and goes on once the sink does; a buffer larger than the queue is taken
     * when the queue is empty. {@code failure}: the sink fails the third buffer: the task's next call throws that
     * exception, the buffers after it are discarded, never pushed. {@code stop}: stopped while the sink is held: the
     * queued buffers are discarded at once, the worker ends once the sink lets go, and a later hand-over is refused.
     * Each answer says how many threads of the probe's stage are still alive at its end.
     */
    public static ObjectNode pushStage(JsonNode r) throws InterruptedException {
        ObjectNode out = JSON.createObjectNode();
        var encoded = new java.util.concurrent.atomic.AtomicInteger();
        var discarded = new java.util.concurrent.atomic.AtomicInteger();
        List<Integer> pushed = java.util.Collections.synchronizedList(new ArrayList<>());
        List<Integer> subs = java.util.Collections.synchronizedList(new ArrayList<>());
        java.util.Set<String> threads = java.util.Collections.synchronizedSet(new java.util.TreeSet<>());
        var entered = new java.util.concurrent.CountDownLatch(1);
        var release = new java.util.concurrent.CountDownLatch(1);
        String scenario = r.path("scenario").asText();
        RuntimeException[] thrown = new RuntimeException[1];
        PushStage.Sink sink = (sub, payload, flags) -> {
            int i = indexOf(payload);
            threads.add(Thread.currentThread().getName());
            boolean hold = (scenario.equals("backpressure") || scenario.equals("stop")) && i == 0
                    || scenario.equals("failure") && i == 2;
            if (hold) {
                entered.countDown();
                try {
                    release.await();
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
                if (scenario.equals("stop")) {
                    throw new IllegalStateException("the connection was closed");
                }
                if (scenario.equals("failure")) {
                    thrown[0] = new IllegalStateException("exchange service refused buffer 2");
                    throw thrown[0];
                }
            }
            pushed.add(i);
            subs.add(sub);
        };
        PushStage stage = new PushStage(PROBE_THREAD, sink, scenario.equals("backpressure") ? 300 : 1 << 20, true);
        switch (scenario) {
            case "order" -> {
                for (int i = 0; i < 200; i++) {
                    stage.submit(i % 7, 0, 10, new Numbered(i, encoded, discarded));
                }
                stage.drain();
            }
            case "backpressure" -> {
                var handed = new java.util.concurrent.atomic.AtomicInteger();
                Thread task = new Thread(() -> {
                    for (int i = 0; i < 6; i++) {
                        stage.submit(i, 0, 100, new Numbered(i, encoded, discarded));
                        handed.incrementAndGet();
                    }
                }, "probe-task");
                task.start();
                boolean waited = within(() -> entered.getCount() == 0 && handed.get() == 3
                        && task.getState() == Thread.State.WAITING);
                out.put("waited_after", handed.get());
                out.put("queued_bytes_while_waiting", stage.queuedBytes());
                out.put("pushed_while_waiting", pushed.size());
                out.put("task_waited", waited);
                release.countDown();
                task.join(20_000);
                out.put("task_done", !task.isAlive());
                stage.drain();
                stage.submit(6, 0, 1_000, new Numbered(6, encoded, discarded)); // larger than the queue: taken alone
                stage.drain();
            }
            case "failure" -> {
                for (int i = 0; i < 6; i++) {
                    stage.submit(i, 0, 10, new Numbered(i, encoded, discarded));
                }
                release.countDown();
                try {
                    stage.drain();
                    out.put("drain", "returned");
                } catch (RuntimeException e) {
                    out.put("drain", e.getMessage());
                    out.put("same_exception", e == thrown[0]);
                }
                try {
                    stage.submit(9, 0, 10, new Numbered(9, encoded, discarded));
                    out.put("later_submit", "taken");
                } catch (RuntimeException e) {
                    out.put("later_submit", e.getMessage());
                }
                out.put("ended", stage.awaitEnd(20_000));
            }
            case "stop" -> {
                for (int i = 0; i < 4; i++) {
                    stage.submit(i, 0, 10, new Numbered(i, encoded, discarded));
                }
                out.put("sink_entered", within(() -> entered.getCount() == 0));
                stage.stop();
                out.put("discarded_at_stop", discarded.get());
                out.put("ended_while_held", stage.awaitEnd(50));
                release.countDown(); // the connection closed under the push: the sink lets go
                out.put("ended", stage.awaitEnd(20_000));
                try {
                    stage.submit(5, 0, 10, new Numbered(5, encoded, discarded));
                    out.put("later_submit", "taken");
                } catch (RuntimeException e) {
                    out.put("later_submit", e.getMessage());
                }
            }
            default -> throw new IllegalArgumentException("unknown scenario " + scenario);
        }
        if (!scenario.equals("failure") && !scenario.equals("stop")) {
            stage.stop();
            out.put("ended", stage.awaitEnd(20_000));
        }
        out.set("pushed", JSON.valueToTree(new ArrayList<>(pushed)));
        out.set("subpartitions", JSON.valueToTree(new ArrayList<>(subs)));
        out.set("threads", JSON.valueToTree(new ArrayList<>(threads)));
        out.put("encoded", encoded.get());
        out.put("discarded", discarded.get());
        out.put("threads_alive", probeThreads());
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

    /** The Spark type of a probe's type name. */
    private static org.apache.spark.sql.types.DataType type(String name) {
        return org.apache.spark.sql.types.DataType.fromDDL(name);
    }

    /**
     * A value of {@code type} from the seed {@code v} (about a third of them null), as a row holds it: both ends of
     * each type's range and values around zero appear.
     */
    private static Object value(org.apache.spark.sql.types.DataType type, long v) {
        if (Math.floorMod(v, 3) == 0) {
            return null;
        }
        long x = v % 5 == 1 ? Long.MIN_VALUE + v : v % 5 == 2 ? Long.MAX_VALUE - v : v * 7919 - 50_000;
        String t = type.typeName();
        if (t.startsWith("decimal")) {
            org.apache.spark.sql.types.DecimalType d = (org.apache.spark.sql.types.DecimalType) type;
            long bound = (long) Math.pow(10, Math.min(d.precision(), 18)) - 1;
            return new org.apache.spark.sql.types.Decimal().set(x % bound, d.precision(), d.scale());
        }
        return switch (t) {
            case "byte" -> (byte) x;
            case "short" -> (short) x;
            case "integer", "date" -> (int) x;
            case "double" -> x * 0.25;
            case "float" -> (float) (x * 0.25);
            case "string" -> org.apache.spark.unsafe.types.UTF8String.fromString(
                    v % 7 == 3 ? "" : v % 7 == 4 ? "\u00e9\u20ac\ud834\udd1e" + x : "s" + x); // empty, multi-byte
            default -> x; // long, timestamp, timestamp_ntz
        };
    }

    /**
     * {@code {"types": [...], "rows": n, "width": w}}: rows of the key columns {@code k0..} of those types (nulls
     * among them), each routed by {@link RowRouter} as a hash write on every key routes it and by Spark's own
     * {@code HashPartitioning(keys, w).partitionIdExpression}, from UnsafeRows; {"rows", "differ": rows routed
     * differently, "direct": the router hashed without a projection}.
     */
    public static JsonNode routeKeys(JsonNode r) {
        org.apache.spark.sql.types.StructType schema = new org.apache.spark.sql.types.StructType();
        List<String> keys = new ArrayList<>();
        for (JsonNode t : r.path("types")) {
            keys.add("k" + keys.size());
            schema = schema.add(keys.get(keys.size() - 1), type(t.asText()));
        }
        int width = r.path("width").asInt();
        WriteSettings s = WriteSettings.defaults().withLayout("hash", keys, width, "HYBRID");
        RowRouter router = new RowRouter(new WriteHandle("probe", 0, "", "", schema, width, s, new java.util.HashMap<>()), 0);
        List<org.apache.spark.sql.catalyst.expressions.Expression> refs = new ArrayList<>();
        for (int i = 0; i < keys.size(); i++) {
            refs.add(new org.apache.spark.sql.catalyst.expressions.BoundReference(i, schema.fields()[i].dataType(), true));
        }
        org.apache.spark.sql.catalyst.expressions.UnsafeProjection spark = org.apache.spark.sql.catalyst.expressions
                .UnsafeProjection.create(new org.apache.spark.sql.catalyst.plans.physical.HashPartitioning(
                        scala.jdk.javaapi.CollectionConverters.asScala(refs).toList(), width).partitionIdExpression());
        org.apache.spark.sql.catalyst.expressions.UnsafeProjection toUnsafe = org.apache.spark.sql.catalyst.expressions
                .UnsafeProjection.create(schema);
        int n = r.path("rows").asInt();
        int differ = 0;
        java.util.Set<Integer> targets = new java.util.HashSet<>();
        for (int row = 0; row < n; row++) {
            Object[] values = new Object[keys.size()];
            for (int i = 0; i < values.length; i++) {
                values[i] = value(schema.fields()[i].dataType(), row * 31L + i * 17L);
            }
            org.apache.spark.sql.catalyst.expressions.UnsafeRow unsafe = toUnsafe.apply(
                    new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(values));
            int got = router.target(unsafe);
            targets.add(got);
            if (got != spark.apply(unsafe).getInt(0)) {
                differ++;
            }
        }
        ObjectNode out = JSON.createObjectNode();
        out.put("rows", n);
        out.put("differ", differ);
        out.put("targets", targets.size());
        out.put("direct", router.direct());
        return out;
    }

    /**
     * {@code {"types": [...], "rows": n, "compression": c}}: one buffer of rows of columns {@code c0..} of those
     * types (nulls among them, UnsafeRows as a task's), hex, and the values as Python reads them
     * ({@code "values"}: per column, the row's value as text, or null).
     */
    public static JsonNode encodeTyped(JsonNode r) {
        org.apache.spark.sql.types.StructType schema = new org.apache.spark.sql.types.StructType();
        int c = 0;
        for (JsonNode t : r.path("types")) {
            schema = schema.add("c" + c++, type(t.asText()));
        }
        org.apache.spark.sql.catalyst.expressions.UnsafeProjection toUnsafe = org.apache.spark.sql.catalyst.expressions
                .UnsafeProjection.create(schema);
        int n = r.path("rows").asInt();
        ObjectNode out = JSON.createObjectNode();
        com.fasterxml.jackson.databind.node.ArrayNode values = out.putArray("values");
        try (BufferEncoder encoder = new BufferEncoder(
                org.apache.spark.sql.util.ArrowUtils.toArrowSchema(schema, "UTC", false, false, false), schema, 1,
                org.sparkflow.exchange.codec.Codecs.forName(r.path("compression").asText("none")))) {
            for (int row = 0; row < n; row++) {
                Object[] v = new Object[schema.fields().length];
                com.fasterxml.jackson.databind.node.ArrayNode texts = values.addArray();
                for (int i = 0; i < v.length; i++) {
                    v[i] = value(schema.fields()[i].dataType(), row * 13L + i * 5L);
                    if (v[i] == null) {
                        texts.addNull();
                    } else {
                        texts.add(String.valueOf(v[i]));
                    }
                }
                encoder.append(0, toUnsafe.apply(new org.apache.spark.sql.catalyst.expressions.GenericInternalRow(v)).copy());
            }
            out.put("hex", java.util.HexFormat.of().formatHex(encoder.encode(0, 64L * n, n)));
        }
        return out;
    }
}
