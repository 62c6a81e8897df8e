package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.codec.Codecs;
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
    static final int ROWS = 4096; // enough for the JIT to compile the row loop's methods (tiered C1)
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

    /** The write path's work, start to end, on rows of the common column types (public for the unit driver). */
    public static void warm() throws Exception {
        StructType rows = new StructType().add("l", DataTypes.LongType).add("i", DataTypes.IntegerType)
                .add("d", DataTypes.DoubleType).add("s", DataTypes.StringType).add("b", DataTypes.BooleanType)
                .add("m", DataTypes.createDecimalType(12, 2)).add("t", DataTypes.DateType)
                .add("ts", DataTypes.TimestampType).add("bin", DataTypes.BinaryType);
        String declared = ExchangeBatchWrite.arrowSchemaBase64(rows); // as a write's declare makes it
        Schema schema = ExchangeDescription.arrowSchema("warmup", declared); // as a task reads it back
        try (BufferEncoder encoder = new BufferEncoder(schema, rows, 2, Codecs.forName(Codecs.DEFAULT))) {
            for (int r = 0; r < ROWS; r++) {
                encoder.append(r & 1, row(r));
            }
            encoder.encode(0, 1 << 16, (ROWS + 1) / 2);
            encoder.encode(1, 1 << 16, ROWS / 2);
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

    private static InternalRow row(int r) {
        return new GenericInternalRow(new Object[] {(long) r, r, r * 0.5, UTF8String.fromString("row-" + r), (r & 1) == 0,
            new Decimal().set(r, 12, 2), r, r * 1_000_000L, new byte[] {(byte) r}});
    }
}
