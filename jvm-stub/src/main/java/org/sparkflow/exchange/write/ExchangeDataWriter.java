package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.sparkflow.exchange.codec.Codecs;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.discovery.Discovery;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.discovery.RuntimeDir;

/**
 * One task attempt's producer ({@code exchange.ProducerTask}): its result partition registered with this host's
 * service and its producer with the coordinator; rows routed to their targets and written into each target's Arrow
 * vectors at once (their size counted as the row's, an UnsafeRow's bytes) until a target holds {@code bufferSize}
 * bytes (or all of them {@code sortBufferSize}), or the oldest held row has waited
 * {@code bufferTimeout} (the output flusher's rule: a reader of a write in progress gets rows while the task runs),
 * then encoded and pushed; at commit the rest pushed, the partition finished with its counts and reported to the
 * coordinator. The wait is checked as rows arrive (every {@link #CLOCK_EVERY} rows): a task whose input stalls
 * holds what it has until its next rows or its end. A full buffer is encoded (compressed) and pushed by a
 * {@link PushStage}: on this thread, or with {@code compressionThread} (a compressed write only) on the writer's own
 * push thread, in the order buffers were handed over.
 */
public final class ExchangeDataWriter implements DataWriter<InternalRow> {
    static final int CLOCK_EVERY = 256;
    /** Full buffers (of {@code bufferSize}) a background push may hold before the task waits for it. */
    static final int QUEUED_BUFFERS = 4;
    /** How long abort and close wait for the push thread's current buffer before closing the connection under it. */
    static final long STOP_WAIT_MILLIS = 2_000;
    /** A timed flush waits at least this many times what the last one took: flushing many small buffers must not
     *  become the writer's main work (the Python writer's rule, FLUSH_COST_FACTOR). */
    static final int FLUSH_COST_FACTOR = 10;
    private static final java.lang.management.ThreadMXBean THREADS =
            java.lang.management.ManagementFactory.getThreadMXBean();
    private final WriteHandle handle;
    private final int index;
    private final String partition;
    private final RowRouter router;
    private final BufferEncoder encoder;
    private final CoordinatorClient coordinator;
    private final ProducerConnection producer;
    private final PushStage stage; // where full buffers are encoded and pushed: this thread, or the writer's own
    private final boolean coordinatorIsService; // the coordinator's calls go on the producer's connection
    private final long[] heldRows;
    private final long[] heldBytes;
    private final long rowEstimate; // bytes counted for a row that is not an UnsafeRow
    private final long[] sentBuffers;
    private final long[] sentRows;
    private long totalHeld;
    private long rows;
    private long oldestHeldAt; // System.nanoTime() when the first row now held arrived
    private long lastTimedFlushNanos; // the CPU time the last timed flush took
    private long handedBytes; // Arrow bytes of the buffers handed to the push stage
    private final byte[] marker; // a MARKER event to every subpartition before the end (a stream's epoch); null: none
    private RuntimeException broken; // a push that failed: its rows left the encoder but not for the service

    ExchangeDataWriter(WriteHandle handle, int index, String attempt) {
        this(handle, index, attempt, null);
    }

    /**
     * A producer of a stream's epoch: {@code marker} (the epoch marker, {@code buffer_kinds.epoch_marker}) goes to
     * every subpartition after the data, as the Python writer sends it and its reader checks it.
     */
    public static ExchangeDataWriter forEpoch(WriteHandle handle, int index, String attempt, byte[] marker) {
        return new ExchangeDataWriter(handle, index, attempt, marker);
    }

    private ExchangeDataWriter(WriteHandle handle, int index, String attempt, byte[] marker) {
        this(handle, index, attempt, handle.name() + "." + handle.epoch() + "." + index + "." + attempt + "."
                + UUID.randomUUID().toString().replace("-", "").substring(0, 8), marker, null);
    }

    /**
     * A writer with no service, whose buffers go to {@code sink} as they leave (the warm-up's, {@link Warmup}): the
     * rows take the path of a write task's, {@link #write} to the push of each buffer, so the JIT compiles that
     * path before the first write runs it. {@link #finishOffline} pushes what is held; nothing is registered.
     */
    static ExchangeDataWriter offline(WriteHandle handle, PushStage.Sink sink) {
        return new ExchangeDataWriter(handle, 0, null, handle.name() + ".offline", null, sink);
    }

    /**
     * The one constructor: with {@code offline} null, a task attempt's producer, its partition registered with this
     * host's service and the coordinator; else the warm-up's writer into {@code offline}. The rows' router comes
     * first (its refusals, e.g. forward's, come before anything is registered).
     */
    private ExchangeDataWriter(WriteHandle handle, int index, String attempt, String partition, byte[] marker,
                               PushStage.Sink offline) {
        this.marker = marker;
        this.handle = handle;
        this.index = index;
        this.partition = partition;
        this.router = new RowRouter(handle, index);
        int width = router.width();
        rowEstimate = Math.max(8, handle.schema().defaultSize());
        heldRows = new long[width];
        heldBytes = new long[width];
        sentBuffers = new long[width];
        sentRows = new long[width];
        WriteSettings s = handle.settings();
        encoder = new BufferEncoder(ExchangeDescription.arrowSchema(handle.name(), handle.schemaBase64()), handle.schema(),
                width, Codecs.forName(s.compression()));
        if (offline != null) {
            coordinator = null;
            coordinatorIsService = false;
            producer = null;
            stage = new PushStage("sparkflow-exchange-push-" + partition, offline,
                    QUEUED_BUFFERS * (long) s.bufferSize(), false);
            return;
        }
        ProducerConnection conn = null;
        try {
            RuntimeDir runtime = RuntimeDir.standard();
            Endpoint service = Discovery.service(handle.discovery(), runtime);
            Endpoint coordinatorAt = Discovery.find(handle.discovery(), runtime);
            coordinator = new CoordinatorClient(coordinatorAt);
            coordinatorIsService = sameService(service, coordinatorAt);
            conn = new ProducerConnection(service, partition, handle.registeredSubpartitions(), s.partitionType(),
                    handle.name(), attempt, s.bufferSize(), s.buffers());
            if (handle.privateReaders() != null) { // before it joins: no reader learns of it before its service knows
                conn.call("set_partition_readers", Map.of("partition", partition, "readers", handle.privateReaders()),
                        CoordinatorClient.TIMEOUT_MILLIS);
            }
            Map<String, Object> args = new LinkedHashMap<>();
            args.put("name", handle.name());
            args.put("epoch", handle.epoch());
            args.put("write_id", handle.writeId());
            args.put("index", index);
            args.put("attempt", attempt);
            args.put("partition", partition);
            args.put("location", conn.location());
            if (coordinatorIsService) {
                conn.call("register_producer", args, CoordinatorClient.TIMEOUT_MILLIS);
            } else {
                coordinator.call("register_producer", args);
            }
        } catch (RuntimeException e) {
            if (conn != null) {
                conn.close();
            }
            encoder.close();
            throw e;
        }
        producer = conn;
        // compressionThread: a compressed write compresses and pushes on a thread of its own while this one fills the
        // next buffers (off by default: with as many tasks as cores it took a core from a task; none never does)
        boolean background = s.compressionThread() && encoder.flags() != 0;
        stage = new PushStage("sparkflow-exchange-push-" + partition, conn::push,
                QUEUED_BUFFERS * (long) s.bufferSize(), background);
    }

    /** An offline writer's end: every held row pushed to its sink; the buffers and rows it pushed in all. */
    long[] finishOffline() {
        refuseIfBroken();
        pushAll();
        stage.drain();
        long buffers = 0;
        long pushed = 0;
        for (int t = 0; t < sentRows.length; t++) {
            buffers += sentBuffers[t];
            pushed += sentRows[t];
        }
        return new long[] {buffers, pushed};
    }

    /**
     * The service this task pushes to is the coordinator itself (local mode's embedded service, or a service with
     * the coordinator role named as both): its calls need no connection of their own.
     */
    static boolean sameService(Endpoint service, Endpoint coordinator) {
        return service.coordinator().equals(coordinator.coordinator())
                && Objects.equals(service.secret(), coordinator.secret())
                && Objects.equals(service.hostId(), coordinator.hostId())
                && Objects.equals(service.tls(), coordinator.tls());
    }

    @Override
    public void write(InternalRow row) {
        refuseIfBroken();
        int target = router.target(row);
        encoder.append(target, row);
        heldRows[target]++;
        long size = row instanceof UnsafeRow u ? u.getSizeInBytes() : rowEstimate;
        if (totalHeld == 0) {
            oldestHeldAt = System.nanoTime();
        }
        heldBytes[target] += size;
        totalHeld += size;
        rows++;
        if (heldBytes[target] >= handle.settings().bufferSize()) {
            push(target);
        }
        if (totalHeld >= handle.settings().sortBufferSize()) {
            pushAll();
        } else if (rows % CLOCK_EVERY == 0 && totalHeld > 0) {
            flushIfOlderThanDue();
        }
    }

    /**
     * Push what is held when its oldest row has waited {@code bufferTimeout} (and {@link #FLUSH_COST_FACTOR} times
     * the last timed flush): a stream's writer calls this from a timer, so rows leave while its input is idle. Not
     * thread-safe: the caller serialises it with {@link #write}.
     */
    public void flushIfDue() {
        refuseIfBroken();
        if (totalHeld == 0) {
            return;
        }
        flushIfOlderThanDue();
    }

    /**
     * The timed flush: everything held leaves once its oldest row waited {@code bufferTimeout} and
     * {@link #FLUSH_COST_FACTOR} times the last timed flush's cost. The cost is the flushing thread's CPU time, not
     * the wall clock: a flush that waited for credit or for a core (a loaded machine preempts threads for tens of
     * ms) cost the writer nothing, and counting that wait would hold the next flush back ten times as long, which
     * set a stream hop's tail.
     */
    private void flushIfOlderThanDue() {
        if (System.nanoTime() - oldestHeldAt >= Math.max(handle.settings().bufferTimeoutNanos(),
                FLUSH_COST_FACTOR * lastTimedFlushNanos)) {
            long before = threadCpuNanos();
            long wallBefore = System.nanoTime();
            long handedBefore = handedBytes;
            pushAll();
            long cpu = threadCpuNanos();
            // a background push spends the compression's CPU on its own thread: still this flush's cost (else
            // flushes every bufferTimeout cut buffers a quarter as large, which compress worse and cost more)
            lastTimedFlushNanos = (before >= 0 && cpu >= 0 ? cpu - before : System.nanoTime() - wallBefore)
                    + stage.workerCpuNanos(handedBytes - handedBefore);
        }
    }

    /** This thread's CPU time in ns, or -1 where the JVM does not measure it. */
    static long threadCpuNanos() {
        return THREADS.isCurrentThreadCpuTimeSupported() ? THREADS.getCurrentThreadCpuTime() : -1;
    }

    private void push(int target) {
        if (heldRows[target] == 0) {
            return;
        }
        try {
            BufferEncoder.Detached buffer = encoder.detach(target, heldRows[target]);
            long bytes = buffer.bytes();
            stage.submit(router.subpartition(target), encoder.flags(), bytes, buffer);
            handedBytes += bytes;
        } catch (RuntimeException e) {
            broken = e; // the target's rows are gone from the encoder: nothing may be committed after this
            throw e;
        }
        sentBuffers[target]++;
        sentRows[target] += heldRows[target];
        heldRows[target] = 0;
        totalHeld -= heldBytes[target];
        heldBytes[target] = 0;
    }

    private void pushAll() {
        for (int t = 0; t < heldRows.length; t++) {
            push(t);
        }
    }

    /**
     * After a failed push the partition cannot be whole: a later push or commit would count rows that never left
     * (end counts that match no buffer), so it fails too, saying why.
     */
    private void refuseIfBroken() {
        if (broken == null) {
            try {
                stage.check(); // a background push that failed: its own exception, once, then the refusal below
            } catch (RuntimeException e) {
                broken = e;
                throw e;
            }
        }
        if (broken != null) {
            throw new IllegalStateException("partition " + partition + " of exchange '" + handle.name()
                    + "' cannot go on: an earlier push of its rows failed (" + broken + ")", broken);
        }
    }

    @Override
    public WriterCommitMessage commit() {
        refuseIfBroken();
        pushAll();
        try {
            stage.drain(); // every buffer pushed, in order, before the marker and the end counts
        } catch (RuntimeException e) {
            broken = e;
            throw e;
        }
        if (marker != null) {
            producer.push(-1, marker, org.sparkflow.exchange.contract.Contract.BufferKind.MARKER, 0);
        }
        JsonNode stats = producer.finish(sentBuffers, sentRows);
        long pushed = 0;
        List<Long> subRows = new ArrayList<>();
        for (long r : sentRows) {
            pushed += r;
            subRows.add(r);
        }
        Map<String, Object> args = new LinkedHashMap<>();
        args.put("name", handle.name());
        args.put("epoch", handle.epoch());
        args.put("partition", partition);
        args.put("spill", stats.path("spill_path").asText(""));
        args.put("subpartition_bytes", stats.get("subpartition_bytes"));
        args.put("subpartition_rows", subRows);
        args.put("rows", pushed);
        args.put("bytes", stats.path("bytes").asLong(0));
        args.put("raw_bytes", stats.path("raw_bytes").asLong(stats.path("bytes").asLong(0))); // uncompressed, as counted by the service
        if (coordinatorIsService) {
            producer.call("producer_finished", args, CoordinatorClient.TIMEOUT_MILLIS);
        } else {
            coordinator.call("producer_finished", args);
        }
        return new ProducerCommit(partition, index, rows);
    }

    @Override
    public void abort() {
        String reason = "the Spark task attempt failed";
        if (stopStage()) {
            producer.fail(reason);
        }
        try {
            coordinator.call("producer_failed", Map.of("name", handle.name(), "epoch", handle.epoch(),
                    "partition", partition, "reason", reason));
        } catch (RuntimeException ignored) {
            // the write's abort releases it anyway
        }
    }

    @Override
    public void close() {
        stopStage();
        if (producer != null) { // null: an offline writer's
            producer.close();
        }
        if (stage.awaitEnd(STOP_WAIT_MILLIS)) {
            encoder.close();
        } // else a push thread still encoding holds some of the encoder's memory: it gives it back as it ends
    }

    /**
     * Stop the background push: what is queued is dropped, the buffer being pushed is waited for (bounded); a push
     * still waiting then (for credit) has its connection closed under it, which fails the partition. Whether the
     * connection is still usable by this thread.
     */
    private boolean stopStage() {
        stage.stop();
        if (stage.awaitEnd(STOP_WAIT_MILLIS)) {
            return true;
        }
        if (producer != null) {
            producer.close();
        }
        stage.awaitEnd(STOP_WAIT_MILLIS);
        return false;
    }
}
