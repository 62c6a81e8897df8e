package org.sparkflow.exchange.read;

import org.sparkflow.exchange.errors.ErrorCodes;
import java.util.Map;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.discovery.Discovery;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.discovery.RuntimeDir;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.contract.Contract.ErrorCode;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * The asking half of a read task of an exchange being written: polls the coordinator (one connection for the task)
 * until {@link LiveProducers} has the next attempt to read or the read's state is complete. Polls start at 10 ms
 * and back off to 200 ms while nothing changes; a read that sees no producer at all within two minutes fails (the
 * Python reader's {@code producerTimeout}).
 */
final class LiveRead implements AutoCloseable {
    static final long FIRST_PAUSE_MILLIS = 10;
    static final long LONGEST_PAUSE_MILLIS = 200;
    static final long NO_PRODUCER_MILLIS = 120_000;
    static final int CALL_TIMEOUT_MILLIS = 30_000;
    private final String exchange;
    private final ReadSettings settings;
    private final LiveProducers producers;
    private final long startedNanos = System.nanoTime();
    private RpcConnection conn;
    private boolean asked;

    LiveRead(SubpartitionInput input, ReadSettings settings) {
        this.exchange = input.exchange();
        this.settings = settings;
        this.producers = new LiveProducers(input.exchange(), input.epoch(), input.liveSeal());
    }

    /** The next attempt to read, waiting for one; null when the read has the whole state. */
    Producer next() {
        long pause = FIRST_PAUSE_MILLIS;
        while (true) {
            Producer p = asked ? producers.next() : null;
            if (p != null) {
                return p;
            }
            if (asked && producers.complete()) {
                String why = producers.notCommitted();
                if (why != null) {
                    throw new ExchangeReadException(why);
                }
                return null;
            }
            if (asked) {
                if (!producers.started() && System.nanoTime() - startedNanos > NO_PRODUCER_MILLIS * 1_000_000) {
                    throw new ExchangeReadException("no producer of exchange '" + exchange + "' registered within "
                            + NO_PRODUCER_MILLIS / 1000 + " s of this read task's start; start the write, or read "
                            + "after it");
                }
                sleep(pause);
                pause = Math.min(LONGEST_PAUSE_MILLIS, pause * 2);
            }
            producers.update(describe());
            asked = true;
        }
    }

    /** {@code p} was read to its end, {@code rows} rows. */
    void finished(Producer p, long rows) {
        producers.finished(p, rows);
    }

    /** Reading {@code p} failed after {@code rows} rows: whether the read goes on without it (see LiveProducers). */
    boolean dropped(Producer p, long rows) {
        if (!producers.dropped(p, rows)) {
            return false;
        }
        producers.update(describe()); // a commit meanwhile may hold it after all: then it is read again
        return true;
    }

    private ExchangeDescription describe() {
        for (int attempt = 0; ; attempt++) {
            try {
                if (conn == null) {
                    conn = connect();
                }
                return ExchangeDescription.parse(conn.call("get_exchange", Map.of("name", exchange)));
            } catch (ServiceError e) {
                if (ErrorCodes.NO_EXCHANGE.equals(e.code())) {
                    throw new ExchangeReadException(ExchangeReadException.gone(exchange, "dropped"));
                }
                if (ErrorCode.CONNECTION_LOST.equals(e.code()) && attempt == 0) {
                    close();
                    continue; // one new connection: the coordinator may have closed an idle one
                }
                throw new ExchangeReadException("exchange '" + exchange + "' is being written and its coordinator at "
                        + settings.coordinator() + " cannot say which producers there are: " + e.getMessage(), e);
            }
        }
    }

    /**
     * The coordinator at the address the read was planned with; a Unix socket that is not on this host (a task on
     * another host than the driver's) gives way to the coordinator this host's runtime directory names.
     */
    private RpcConnection connect() {
        try {
            return new RpcConnection(settings.coordinator(), settings.secret(), settings.hostId(), CALL_TIMEOUT_MILLIS,
                    settings.tls());
        } catch (ServiceError e) {
            if (!settings.coordinator().startsWith("unix:")) {
                throw e;
            }
            Endpoint here;
            try {
                here = Discovery.find(Map.of(), RuntimeDir.standard());
            } catch (RuntimeException none) {
                throw e;
            }
            return new RpcConnection(here.coordinator(), here.secret(), settings.hostId(), CALL_TIMEOUT_MILLIS,
                    settings.tls());
        }
    }

    private static void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new ExchangeReadException("the read task was interrupted while it waited for producers");
        }
    }

    @Override
    public void close() {
        if (conn != null) {
            conn.close();
            conn = null;
        }
    }
}
