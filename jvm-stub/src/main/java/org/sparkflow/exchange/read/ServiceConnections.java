package org.sparkflow.exchange.read;

import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.Map;
import org.sparkflow.exchange.wire.RpcConnection;
import org.sparkflow.exchange.wire.Tls;

/**
 * A read task's authenticated connections to exchange services, one per address, kept from one producer to the next
 * (Flink's PartitionRequestClientFactory keeps one per task manager): a read of 200 producers on one service pays one
 * handshake, not 200. A connection goes back only when every channel on it ended; one idle longer than
 * {@link #IDLE_MILLIS} is closed rather than reused (its service may have let it go). Receiver ids are never reused
 * on a connection.
 */
final class ServiceConnections implements AutoCloseable {
    static final long IDLE_MILLIS = 5_000;

    private record Idle(RpcConnection conn, long sinceNanos) {}

    private final Map<String, Idle> idle = new HashMap<>();
    private final Map<RpcConnection, Long> nextReceiver = new IdentityHashMap<>();

    /** A connection to {@code address}: the idle one kept for it, else a new one. */
    RpcConnection take(String address, String secret, String hostId, int timeoutMillis, Tls tls) {
        Idle kept = idle.remove(address);
        if (kept != null) {
            if (System.nanoTime() - kept.sinceNanos() <= IDLE_MILLIS * 1_000_000) {
                return kept.conn();
            }
            discard(kept.conn());
        }
        return new RpcConnection(address, secret, hostId, timeoutMillis, tls);
    }

    /** Whether {@code conn} was handed out from the idle ones (a failure on it may be its age, not its service). */
    boolean reused(RpcConnection conn) {
        return nextReceiver.containsKey(conn);
    }

    /** The first of {@code count} receiver ids not used on {@code conn} before. */
    long receivers(RpcConnection conn, int count) {
        long first = nextReceiver.getOrDefault(conn, 1L);
        nextReceiver.put(conn, first + count);
        return first;
    }

    /** {@code conn} has no channel open any more: kept for the next producer of its service. */
    void giveBack(RpcConnection conn) {
        Idle old = idle.put(conn.address(), new Idle(conn, System.nanoTime()));
        if (old != null && old.conn() != conn) {
            discard(old.conn());
        }
    }

    /** {@code conn} is not to be used again. */
    void discard(RpcConnection conn) {
        nextReceiver.remove(conn);
        conn.close();
    }

    @Override
    public void close() {
        for (Idle i : idle.values()) {
            discard(i.conn());
        }
        idle.clear();
    }
}
