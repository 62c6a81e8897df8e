package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.wire.Frames;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * A JVM's first exchange write loads about 700 classes the rest of Spark does not use (Arrow's vectors, IPC
 * writer and allocator, the flatbuffers, the HMAC of the handshake, this jar's own) and runs its row loop cold:
 * measured on {@code local[2]}, that is most of what a fresh application's first write pays over Spark's
 * {@code noop} sink. Run once per JVM on a daemon thread when the session starts ({@code WarmupExtension},
 * which {@code sparkflow_exchange.configure} names in {@code spark.sql.extensions}), it does the same work on
 * a few thousand throw-away rows while the application starts and runs its first jobs, so the first write
 * finds it done. Best effort: a failure here changes nothing but the first write's time.
 */
public final class Warmup {
    static final int ROWS = 100_000; // past the optimising compiler's thresholds for a row's methods, which a busy compile queue at start raises
    static final int TARGETS = 200; // spark.sql.shuffle.partitions' default: a write's common width
    /** A target's buffer leaves at this many bytes (15-18 of its rows): 7,000 buffers or more in all. */
    static final int BUFFER_BYTES = 1536;
    /** Rows first written in buffers of {@link #GROWING_BUFFER_BYTES} (about 80 rows: past BufferEncoder's 32). */
    static final int GROWING_ROWS = 20_000;
    static final int GROWING_BUFFER_BYTES = 8192;
    /** Calls after which the optimising compiler takes a method (HotSpot's Tier4InvocationThreshold). */
    static final int BUFFERS = 5_000;
    static final int CONNECT_MILLIS = 10_000;
    private static final AtomicBoolean STARTED = new AtomicBoolean();

    private Warmup() {
    }

    /** Start the warm-up, once per JVM; returns at once. */
    public static void start() {
        if (STARTED.compareAndSet(false, true)) {
            Thread t = new Thread(Warmup::run, "sparkflow-exchange-warmup");
            t.setDaemon(true);
            t.setPriority(Thread.MIN_PRIORITY);
            t.start();
        }
    }

    private static void run() {
        try {
            warm();
        } catch (Throwable ignored) { // NOPMD - best effort: the real write loads what it needs itself
        }
    }

    /**
     * The write path's work, start to end, as a task does it (public for the unit driver): rows of the common column
     * types as Spark hands a writer its rows ({@link UnsafeRow}s: a warm-up on other rows left the JIT's code
     * specialised for them, undone at the first real rows), through an {@link ExchangeDataWriter} of its own (no
     * service: {@link ExchangeDataWriter#offline}) hashed into {@link #TARGETS} targets, each target's buffer encoded
     * with the default codec and pushed (framed, then dropped) whenever it holds {@link #BUFFER_BYTES}. {@link #ROWS}
     * rows: enough for the JIT's optimising compiler to compile the writer's row method, the vectors' allocation
     * and, with more than {@link #BUFFERS} buffers, each buffer's encoding and push here, not in the first writes
     * (with a buffer per 100 rows, the encoding was still compiled during a session's first two writes); before them
     * {@link #GROWING_ROWS} rows in larger buffers, whose vectors grow past their first size as a write's do (with
     * small buffers only, the first write's growing vectors threw the compiled code away). What it made: its buffers,
     * their rows (checked: a warm-up that lost rows says so).
     */
    public static long[] warm() throws Exception {
        StructType rows = new StructType().add("l", DataTypes.LongType).add("i", DataTypes.IntegerType)
                .add("d", DataTypes.DoubleType).add("s", DataTypes.StringType).add("b", DataTypes.BooleanType)
                .add("m", DataTypes.createDecimalType(12, 2)).add("t", DataTypes.DateType)
                .add("ts", DataTypes.TimestampType).add("bin", DataTypes.BinaryType);
        String declared = ExchangeBatchWrite.arrowSchemaBase64(rows); // as a write's declare makes it
        WriteSettings layout = WriteSettings.defaults()
                .withLayout(Contract.Partitioner.HASH, List.of("l"), TARGETS, Contract.OptionDefault.PARTITION_TYPE);
        WriteHandle growing = new WriteHandle("warmup", 0, "", declared, rows, TARGETS,
                layout.with(List.of(Map.of(Contract.Option.BUFFER_SIZE, String.valueOf(GROWING_BUFFER_BYTES)))),
                new HashMap<>());
        WriteHandle handle = new WriteHandle("warmup", 0, "", declared, rows, TARGETS,
                layout.with(List.of(Map.of(Contract.Option.BUFFER_SIZE, String.valueOf(BUFFER_BYTES)))), new HashMap<>());
        // a task gets its write's handle, and the driver each task's commit, by Java serialization, whose first
        // use of a record class builds the method handles of its constructor (classes spun and compiled)
        ProducerCommit commit = new ProducerCommit("warmup", 0, ROWS);
        if (!handle.equals(roundTrip(handle)) || !commit.equals(roundTrip(commit))) {
            throw new IllegalStateException("the warm-up's write handle or commit changed in serialization");
        }
        UnsafeRowWriter writer = new UnsafeRowWriter(rows.size(), 32);
        byte[] header = new byte[Contract.DataHeaderSize.PUSH_BUFFER];
        PushStage.Sink sink = (subpartition, payload, flags) -> Frames.encode(Frames.PUSH_BUFFER, header, payload.length);
        long[] made = {0, 0};
        // first buffers of more rows than a target's vectors are made for (they grow, as a write's do: a branch the
        // compiled code must keep), then many small ones (each buffer's encoding and push compiled)
        for (WriteHandle h : List.of(growing, handle)) {
            int n = h == growing ? GROWING_ROWS : ROWS;
            ExchangeDataWriter task = ExchangeDataWriter.offline(h, sink); // pushes frame each buffer, as a push does
            try {
                for (int r = 0; r < n; r++) {
                    task.write(row(writer, r));
                }
                long[] pushed = task.finishOffline();
                if (pushed[1] != n) {
                    throw new IllegalStateException("the warm-up pushed " + pushed[1] + " of its " + n + " rows");
                }
                made[0] += pushed[0];
                made[1] += pushed[1];
            } finally {
                task.close();
            }
        }
        Mac hmac = Mac.getInstance("HmacSHA256"); // the handshake's
        hmac.init(new SecretKeySpec("warmup".getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
        hmac.doFinal(new byte[16]);
        ObjectMapper json = new ObjectMapper(); // the RPCs' headers
        json.readTree(json.writeValueAsBytes(Map.of("name", "warmup", "rows", List.of(1L, 2L), "ok", true)));
        ManagementFactory.getRuntimeMXBean().getName(); // the handshake's client id
        for (Class<?> c : List.of(ExchangeDataWriter.class, ProducerConnection.class, RowRouter.class,
                ProducerCommit.class, ExchangeDataWriterFactory.class)) {
            Class.forName(c.getName(), true, c.getClassLoader());
        }
        return made;
    }

    /**
     * One connection to {@code service} and a call on it, closed at once: a JVM's first connection loads and runs
     * the socket channel, selector, nonce and handshake code cold (measured on a busy {@code local[2]}: 27-32 ms a
     * connection for the first ones against 2.5 ms warm, and a write makes several). Best effort.
     */
    public static void connect(Endpoint service) {
        try (RpcConnection conn = new RpcConnection(service.coordinator(), service.secret(), service.hostId(),
                CONNECT_MILLIS, service.tls())) {
            conn.call("ping", Map.of());
        } catch (RuntimeException ignored) { // NOPMD - best effort: the first write connects and says what fails
        }
    }

    private static Object roundTrip(Object value) throws IOException, ClassNotFoundException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
            out.writeObject(value);
        }
        try (ObjectInputStream in = new ObjectInputStream(new ByteArrayInputStream(bytes.toByteArray()))) {
            return in.readObject();
        }
    }

    /** Row {@code r} in {@code w}'s buffer (reused, as a Spark plan reuses its row): a null now and then. */
    private static UnsafeRow row(UnsafeRowWriter w, int r) {
        w.reset();
        w.zeroOutNullBytes();
        w.write(0, r * 0x9E3779B97F4A7C15L);
        if (r % 97 == 0) {
            w.setNullAt(1);
            w.setNullAt(3);
        } else {
            w.write(1, r);
            w.write(3, UTF8String.fromString("row-" + r));
        }
        w.write(2, r * 0.5);
        w.write(4, (r & 1) == 0);
        w.write(5, new Decimal().set(r, 12, 2), 12, 2);
        w.write(6, r);
        w.write(7, r * 1_000_000L);
        w.write(8, new byte[] {(byte) r});
        return w.getRow();
    }
}
