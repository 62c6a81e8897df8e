package org.sparkflow.exchange.read;

import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.contract.Contract.PartitionState;

/**
 * Which producer attempts a read task takes from an exchange that was being written when the read was planned, and
 * when it has all of them; sans-IO (it takes the coordinator's descriptions, the reader does the polling), as
 * {@code input_gate.py}'s producer set.
 *
 * <p>The read ends at the exchange's first seal after its planning (the description's {@code seals} then): until
 * that seal it takes every registered attempt that has not failed, as it registers; once the seal happened, exactly
 * the committed producers that seal holds. An attempt that gave rows and is not among them (it lost the commit, or
 * its write was aborted) fails the task: Spark retries it, and the retry reads the sealed state alone. Each attempt
 * is read once, all of the read partition's subpartitions of it together.
 */
public final class LiveProducers {
    private final String exchange;
    private final long epoch;
    private final int seal;
    private List<Producer> registered = List.of();
    private List<Producer> state; // the seal's committed producers, once it happened
    private final Set<String> taken = new HashSet<>(); // attempts read to their end
    private final Set<String> failed = new HashSet<>(); // attempts that failed before giving rows
    private final Set<String> gaveRows = new HashSet<>(); // attempts that gave rows

    /** A read of {@code exchange} at {@code epoch}, planned after {@code seal} seals. */
    public LiveProducers(String exchange, long epoch, int seal) {
        this.exchange = exchange;
        this.epoch = epoch;
        this.seal = seal;
    }

    /** The coordinator's description now; fails the read when the exchange was replaced or its write aborted. */
    public void update(ExchangeDescription d) {
        if (d.epoch != epoch) {
            throw new ExchangeReadException(ExchangeReadException.gone(exchange, "overwritten"));
        }
        if (d.readable.ended()) { // the coordinator's verdict: aborted (or gone), nothing to read any more
            throw new ExchangeReadException(d.readable.reason() + "; this read has no committed state to return: "
                    + "write it again");
        }
        if (state == null) {
            state = d.readState(seal);
            registered = List.copyOf(d.registered);
        }
    }

    /** The next attempt to read; null when there is none now (see {@link #complete()}). */
    public Producer next() {
        if (state != null) {
            return state.stream().filter(p -> !taken.contains(p.partition())).findFirst().orElse(null);
        }
        return registered.stream().filter(p -> !taken.contains(p.partition()) && !failed.contains(p.partition())
                && !PartitionState.FAILED.equals(p.state())).findFirst().orElse(null);
    }

    /** Whether every producer of the read's state was read. */
    public boolean complete() {
        return state != null && state.stream().allMatch(p -> taken.contains(p.partition()));
    }

    /** Whether any attempt has registered, or the state is known (a read with nothing to wait for). */
    public boolean started() {
        return state != null || !registered.isEmpty();
    }

    /** {@code p} was read to its end of partition, {@code rows} rows. */
    public void finished(Producer p, long rows) {
        taken.add(p.partition());
        if (rows > 0) {
            gaveRows.add(p.partition());
        }
    }

    /**
     * Reading {@code p} failed after {@code rows} of its rows: true when the read may go on without it (it gave
     * none and is not committed: it lost or failed, and the seal will not hold it).
     */
    public boolean dropped(Producer p, long rows) {
        if (rows > 0 || gaveRows.contains(p.partition()) || taken.contains(p.partition())) {
            return false;
        }
        if (state != null && state.stream().anyMatch(c -> c.partition().equals(p.partition()))) {
            return false;
        }
        failed.add(p.partition());
        return true;
    }

    /** Once complete: why the rows read are not one committed state, or null when they are. */
    public String notCommitted() {
        for (String partition : gaveRows) {
            if (state.stream().noneMatch(c -> c.partition().equals(partition))) {
                return "this read took rows from producer attempt " + partition + " of exchange '" + exchange
                        + "', which the commit does not hold (another attempt of its task won, or its write was "
                        + "aborted); the read task must be retried to see each row once";
            }
        }
        return null;
    }
}
