package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Map;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.contract.Contract.ErrorCode;
import org.sparkflow.exchange.wire.Frames;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * One result partition pushed into this host's exchange service under credit ({@code partition_writer.py}):
 * registered, then each data buffer spends one credit the service granted (one free slot of the partition's
 * pool; with none the push waits, which is backpressure), then finished with what was pushed per subpartition so
 * the service and every reader can tell nothing was lost. Over the socket only: no shared-memory slots.
 */
final class ProducerConnection implements AutoCloseable {
    static final int TIMEOUT_MILLIS = 300_000; // pipelined.noConsumerTimeout's default: a bounded partition waits
    static final long LOOK_EVERY_NANOS = 500_000_000L; // a writer with credit still reads the service's news
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private final RpcConnection conn;
    private final String partition;
    private final JsonNode location;
    private long handle;
    private int credit;
    private long nextLook;
    private boolean finished;

    ProducerConnection(Endpoint service, String partition, int numSubpartitions, String partitionType,
                       String exchange, String attempt, int bufferSize, int buffers) {
        this.partition = partition;
        this.conn = new RpcConnection(service.coordinator(), service.secret(), service.hostId(), TIMEOUT_MILLIS,
                service.tls());
        try {
            // where readers find this partition, asked before the registration and answered with it: one round trip
            long ping = conn.request("ping", Map.of());
            ObjectNode msg = MAPPER.createObjectNode();
            msg.put("partition", partition);
            msg.put("num_subpartitions", numSubpartitions);
            msg.put("partition_type", partitionType);
            msg.put("exchange", exchange);
            msg.put("attempt", attempt);
            msg.put("buffer_size", bufferSize);
            msg.put("buffers", buffers);
            msg.put("shm_path", "");
            msg.put("shm_slots", 0);
            msg.put("shm_slot_size", 0);
            conn.send(Frames.encode(Frames.REGISTER_PARTITION, msg.toString()));
            location = conn.response(ping, "ping", this::onFrame, TIMEOUT_MILLIS);
            while (handle == 0) {
                onFrame(conn.receive());
            }
        } catch (RuntimeException e) {
            conn.close();
            throw e;
        }
    }

    JsonNode location() {
        return location;
    }

    /**
     * A coordinator call on this connection (the service is the coordinator: local mode's embedded service), waiting
     * up to {@code waitMillis} for its answer; credit and partition news arriving meanwhile are taken as a push
     * takes them. Saves the task a connection and its handshake per call.
     */
    JsonNode call(String method, Map<String, Object> args, int waitMillis) {
        return conn.response(conn.request(method, args), method, this::onFrame, waitMillis);
    }

    /** Push one data buffer to {@code subpartition} (-1: every subpartition), waiting for credit ({@code flags}: buffer_kinds). */
    void push(int subpartition, byte[] payload, int flags) {
        push(subpartition, payload, Contract.BufferKind.DATA, flags);
    }

    /** Push one buffer of {@code kind} (a MARKER event takes a credit as a data buffer does). */
    void push(int subpartition, byte[] payload, int kind, int flags) {
        if (credit <= 0 || System.nanoTime() >= nextLook) {
            look();
        }
        while (credit <= 0) {
            onFrame(conn.receive());
        }
        credit--;
        byte[] header = ByteBuffer.allocate(Contract.DataHeaderSize.PUSH_BUFFER).putLong(handle).putInt(subpartition).put((byte) kind).put((byte) flags)
                .array();
        conn.send(Frames.encode(Frames.PUSH_BUFFER, header, payload.length), payload);
    }

    private void look() {
        nextLook = System.nanoTime() + LOOK_EVERY_NANOS;
        for (Frames.Frame f = conn.poll(); f != null; f = conn.poll()) {
            onFrame(f);
        }
    }

    /** End the partition with what was pushed ({"buffers": [...], "rows": [...]}); the service's stats. */
    JsonNode finish(long[] buffers, long[] rows) {
        ObjectNode msg = MAPPER.createObjectNode();
        msg.put("handle", handle);
        ObjectNode counts = msg.putObject("counts");
        ArrayNode b = counts.putArray("buffers");
        ArrayNode r = counts.putArray("rows");
        for (int i = 0; i < buffers.length; i++) {
            b.add(buffers[i]);
            r.add(rows[i]);
        }
        conn.send(Frames.encode(Frames.FINISH_PARTITION, msg.toString()));
        while (true) {
            Frames.Frame f = conn.receive();
            if (f.type() == Frames.PARTITION_FINISHED) {
                JsonNode finishedMsg = json(f);
                if (finishedMsg.path("handle").asLong() == handle) {
                    finished = true;
                    return finishedMsg.path("stats");
                }
            } else {
                onFrame(f);
            }
        }
    }

    /** Fail the partition (its readers hear why); best effort, the connection's end fails it too. */
    void fail(String reason) {
        if (finished || handle == 0) {
            return;
        }
        try {
            ObjectNode msg = MAPPER.createObjectNode();
            msg.put("handle", handle);
            msg.put("reason", reason);
            conn.send(Frames.encode(Frames.FAIL_PARTITION, msg.toString()));
        } catch (ServiceError ignored) {
            // the connection is gone: the service fails the partition for it
        }
    }

    private void onFrame(Frames.Frame f) {
        switch (f.type()) {
            case Frames.PARTITION_REGISTERED -> {
                JsonNode m = json(f);
                if (handle == 0 && partition.equals(m.path("partition").asText())) {
                    handle = m.path("handle").asLong();
                }
            }
            case Frames.PRODUCER_CREDIT -> {
                ByteBuffer h = ByteBuffer.wrap(f.header());
                if (h.getLong(0) == handle) {
                    credit += h.getInt(8);
                }
            }
            case Frames.PARTITION_RELEASED -> {
                JsonNode m = json(f);
                // once finished, its rows are whole: a release then (heard during the task's last coordinator call
                // on this connection) is the partition's ordinary end, not the write's failure
                if (m.path("handle").asLong() == handle && !finished) {
                    String replaced = ErrorCode.REPLACED.equals(m.path("code").asText())
                            ? "; the write cannot be committed: write the exchange again" : "";
                    throw ErrorCodes.error(m.path("code").asText(ErrorCodes.RELEASED), m.path("message").asText() + replaced);
                }
            }
            case Frames.ERROR_RESPONSE -> {
                JsonNode m = json(f);
                throw ErrorCodes.error(m.path("code").asText(ErrorCodes.ERROR), "exchange service refused partition " + partition + ": "
                        + m.path("message").asText());
            }
            default -> {
                // slots freed, notifications: nothing for a socket writer
            }
        }
    }

    private static JsonNode json(Frames.Frame f) {
        try {
            return MAPPER.readTree(f.header());
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                    "protocol error: a frame's JSON header is unreadable: " + e.getMessage());
        }
    }

    @Override
    public void close() {
        conn.close();
    }
}
