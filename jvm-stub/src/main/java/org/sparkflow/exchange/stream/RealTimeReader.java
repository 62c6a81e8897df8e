package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeRead;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.read.BufferDecoder;
import org.sparkflow.exchange.read.CreditReceiver;
import org.sparkflow.exchange.read.ExchangeReadException;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.read.SpillIndex;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.contract.Contract.ExchangeState;
import org.sparkflow.exchange.contract.Contract.PartitionState;
import org.sparkflow.exchange.wire.Frames;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * A Real-time Mode read task: subpartition i of every producer of the stream, taken as the writer pushes it.
 *
 * <p>A feeder thread walks the epochs from the task's start position: it finds each epoch's exchange (a long poll at
 * the coordinator, woken by its declaration), and reads subpartition i of every producer task of it at once, one
 * fetcher thread per task (one attempt of it at a time), each under credit from the attempt's service: a fetcher
 * hands a buffer to the task's bounded queue, then gives its credit back, so a task that does not keep up stops its
 * producers' services from sending (and their writers from writing, once their buffers are full). The feeder asks
 * the coordinator which attempts there are (every 2 ms, backing off to 50 ms while nothing changes) until the epoch
 * is sealed; then it reads the committed attempts to their ends and moves on.
 *
 * <p>Rows are counted per producer task (its index), not per attempt: an attempt that fails (its writer died), loses
 * the commit, or whose micro-batch the restarted writer query replays (a new generation of the epoch) is followed by
 * the next attempt of the same task, of which the rows already taken are skipped. A writer replaying a micro-batch
 * writes the same rows in the same order per task (a replayable source, a deterministic plan: what Spark's own
 * exactly-once replay assumes), so each row is returned once.
 *
 * <p>{@link #nextWithTimeout} waits on the queue (no sleep, no polling loop); rows are decoded in the task thread.
 * The task's offset is the epoch being read and the rows taken of each producer task: a restart skips exactly
 * those rows, whichever attempt or generation of the epoch it then reads. With them it keeps where in the attempt it
 * read each task's next row is (the buffer's sequence number and the attempt's rows before it): the next batch's task
 * (Real-time Mode ends the tasks at every batch's end) asks that attempt's service for the subpartition from that
 * buffer on, so a batch boundary costs no read of the epoch again. Another attempt (a retry, a replay), an offset
 * without that place, or a service that no longer holds it, is read from its start, skipping the rows taken.
 */
final class RealTimeReader implements SupportsRealTimeRead<InternalRow> {
    static final int QUEUE_BUFFERS = 8; // buffers decoded ahead of the task, over all its producers
    static final int CREDIT = 4; // buffers each producer's service may send ahead
    static final long FIRST_LOOK_MILLIS = 2;
    static final long LONGEST_LOOK_MILLIS = 50;
    static final double EPOCH_WAIT_SECONDS = 5.0; // one long poll for the next epoch's exchange
    static final int CALL_TIMEOUT_MILLIS = 60_000;
    static final int DATA_TIMEOUT_MILLIS = 24 * 3600 * 1000; // a stream may be idle for long: the writer says when it ends
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final Logger LOG = LoggerFactory.getLogger(RealTimeReader.class);

    /** Read task {@code index}: subpartition {@code index} from {@code start} on. */
    record Input(String stream, int index, StreamOffset.Position start, String schemaBase64, int[] columns,
                 ReadSettings settings) implements InputPartition {}

    /** Where a task is: {@code position} of subpartition {@code index}. */
    record SubpartitionOffset(int index, StreamOffset.Position position) implements PartitionOffset {}

    private enum Kind { DATA, EPOCH_DONE, FAILED }

    /**
     * A buffer of producer task {@code task} (its attempt {@code producer}, sequence number {@code seq}), an epoch's
     * end, or the read's failure. {@code fromRows}: on the first buffer a fetcher hands over, the attempt's rows
     * before it (0 from the start, more when the read resumed), else -1.
     */
    private record Item(Kind kind, long epoch, String task, String producer, long seq, long fromRows, byte[] payload,
                        long receivedMs, RuntimeException error) {
        static Item end(long epoch) {
            return new Item(Kind.EPOCH_DONE, epoch, null, null, -1, -1, null, 0, null);
        }

        static Item failed(RuntimeException error) {
            return new Item(Kind.FAILED, -1, null, null, -1, -1, null, 0, error);
        }
    }

    private final Input input;
    private final BlockingQueue<Item> queue = new ArrayBlockingQueue<>(QUEUE_BUFFERS);
    private final BufferAllocator allocator;
    private final VectorSchemaRoot root;
    private final BufferDecoder decoder;
    private final Feeder feeder;
    private long epoch; // the epoch being read (every earlier one read)
    // rows of each producer task of this epoch returned, by this task or (from its start offset) an earlier batch's:
    // the offset, and what a next attempt of the producer task skips
    private final SortedMap<String, Long> taken = new TreeMap<>();
    private final Map<String, String> attempt = new HashMap<>(); // the attempt each task's rows now come from
    private final Map<String, Long> seen = new HashMap<>(); // rows received of that attempt (skipped ones too)
    // where each producer task's next row is, for a next batch's task to go on from (the offset keeps it)
    private final SortedMap<String, StreamOffset.Resume> resume = new TreeMap<>();
    private ColumnarBatch batch;
    private String batchProducer;
    private String batchAttempt;
    private long batchSeq;
    private long batchBase; // rows of batchProducer before this batch
    private int row = -1;
    private int rows;

    RealTimeReader(Input input) {
        this.input = input;
        this.epoch = input.start().epoch();
        this.taken.putAll(input.start().rows()); // a batch that takes none of them keeps them in its offset
        this.resume.putAll(input.start().buffers());
        this.allocator = ArrowUtils.rootAllocator().newChildAllocator(
                "sparkflow-exchange stream " + input.stream() + "/" + input.index(), 0, Long.MAX_VALUE);
        try {
            Schema schema = MessageSerializer.deserializeSchema(new ReadChannel(
                    Channels.newChannel(new ByteArrayInputStream(Base64.getDecoder().decode(input.schemaBase64())))));
            this.root = VectorSchemaRoot.create(schema, allocator);
        } catch (IOException e) {
            allocator.close();
            throw new ExchangeReadException("stream '" + input.stream() + "' has an unreadable schema: " + e, e);
        }
        this.decoder = new BufferDecoder(allocator, root);
        this.feeder = new Feeder();
        feeder.start();
    }

    @Override
    public RecordStatus nextWithTimeout(Long timeoutMs) throws IOException {
        if (batch != null && row + 1 < rows) {
            row++;
            taken.put(batchProducer, batchBase + row + 1);
            return RecordStatus.newStatusWithoutArrivalTime(true);
        }
        long deadline = System.nanoTime() + Math.max(0, timeoutMs == null ? 0 : timeoutMs) * 1_000_000L;
        while (true) {
            Item item;
            try {
                item = queue.poll(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new ExchangeReadException("the read task of stream '" + input.stream() + "' was interrupted");
            }
            if (item == null) {
                return RecordStatus.newStatusWithoutArrivalTime(false);
            }
            switch (item.kind()) {
                case FAILED -> throw item.error();
                case EPOCH_DONE -> {
                    epoch = item.epoch() + 1;
                    taken.clear();
                    attempt.clear();
                    seen.clear();
                    resume.clear();
                    batch = null;
                    continue;
                }
                case DATA -> {
                    if (load(item)) {
                        return RecordStatus.newStatusWithArrivalTimeMs(item.receivedMs());
                    }
                }
            }
        }
    }

    /** Decode a buffer; whether it holds a row to return (a restart skips the rows it returned before). */
    private boolean load(Item item) {
        int n;
        try {
            n = decoder.load(item.payload());
        } catch (BufferDecoder.CorruptBuffer e) {
            throw new ExchangeReadException("corrupt data in stream '" + input.stream() + "', epoch " + item.epoch()
                    + ", producer " + item.producer() + ", subpartition " + input.index() + ": " + e.getMessage());
        } catch (IOException e) {
            throw new ExchangeReadException("stream '" + input.stream() + "': " + e.getMessage(), e);
        }
        if (batch != null) { // every row of the last batch was returned: its task goes on after it
            resume.put(batchProducer, new StreamOffset.Resume(batchAttempt, batchSeq + 1, batchBase + rows));
            batch = null;
        }
        String task = item.task();
        if (item.fromRows() >= 0) { // a fetcher's first buffer: from the attempt's start, or where a resume began
            attempt.put(task, item.producer());
            seen.put(task, item.fromRows());
        } else if (!item.producer().equals(attempt.get(task))) { // another attempt: the same rows from its start
            attempt.put(task, item.producer());
            seen.put(task, 0L);
        }
        long base = seen.get(task);
        seen.put(task, base + n);
        long skipTo = taken.getOrDefault(task, 0L);
        int first = (int) Math.max(0, Math.min(n, skipTo - base));
        if (first >= n) {
            taken.put(task, Math.max(taken.getOrDefault(task, 0L), base + n));
            resume.put(task, new StreamOffset.Resume(item.producer(), item.seq() + 1, base + n));
            return false;
        }
        ColumnVector[] vectors = new ColumnVector[input.columns().length];
        for (int i = 0; i < vectors.length; i++) {
            vectors[i] = new Column(root.getVector(input.columns()[i]));
        }
        batch = new ColumnarBatch(vectors, n);
        batchProducer = task;
        batchAttempt = item.producer();
        batchSeq = item.seq();
        batchBase = base;
        rows = n;
        row = first;
        taken.put(batchProducer, batchBase + row + 1);
        return true;
    }

    @Override
    public boolean next() throws IOException {
        while (true) {
            if (nextWithTimeout(60_000L).hasRecord()) {
                return true;
            }
        }
    }

    @Override
    public InternalRow get() {
        return batch.getRow(row);
    }

    @Override
    public PartitionOffset getOffset() {
        SortedMap<String, StreamOffset.Resume> buffers = new TreeMap<>(resume);
        if (batch != null) { // rows of this buffer not returned yet: the next task starts at it, else after it
            buffers.put(batchProducer, row + 1 < rows ? new StreamOffset.Resume(batchAttempt, batchSeq, batchBase)
                    : new StreamOffset.Resume(batchAttempt, batchSeq + 1, batchBase + rows));
        }
        return new SubpartitionOffset(input.index(), new StreamOffset.Position(epoch, new TreeMap<>(taken), buffers));
    }

    @Override
    public void close() {
        feeder.shutdown();
        batch = null;
        root.close();
        allocator.close();
    }

    private String where(long e) {
        return "stream '" + input.stream() + "', epoch " + e + ", subpartition " + input.index();
    }

    /** A column of the task's root; the root owns its vectors (Spark must not close them). */
    private static final class Column extends ArrowColumnVector {
        Column(org.apache.arrow.vector.ValueVector vector) {
            super(vector);
        }

        @Override
        public void close() {}
    }

    /** Walks the epochs, one fetcher per producer attempt of the epoch being read. */
    private final class Feeder extends Thread {
        private volatile boolean stopping;
        private volatile RpcConnection coordinator;
        private final Map<Integer, Fetcher> fetchers = new java.util.concurrent.ConcurrentHashMap<>(); // by task
        // where the task's start offset says each producer task's read of its start epoch goes on (used once)
        private final Map<String, StreamOffset.Resume> resumes = new HashMap<>(input.start().buffers());

        Feeder() {
            super("sparkflow-stream " + input.stream() + "/" + input.index());
            setDaemon(true);
        }

        @Override
        public void run() {
            try {
                for (long e = input.start().epoch(); !stopping; e++) {
                    readEpoch(e);
                    put(Item.end(e));
                }
            } catch (InterruptedException stopped) {
                // the task closed
            } catch (RuntimeException failure) {
                if (!stopping) {
                    queue.clear(); // room for the failure: the task sees it next
                    queue.offer(Item.failed(failure));
                }
            } finally {
                cancelFetchers();
                if (coordinator != null) {
                    coordinator.close();
                }
            }
        }

        /** From the task's thread: the feeder stops (a call it waits in ends with its connection). */
        void shutdown() {
            stopping = true;
            interrupt();
            cancelFetchers();
            RpcConnection c = coordinator;
            if (c != null) {
                c.close();
            }
            queue.clear();
        }

        private void put(Item item) throws InterruptedException {
            queue.put(item);
        }

        private JsonNode call(String method, Map<String, Object> args) {
            for (int attempt = 0; ; attempt++) {
                try {
                    if (coordinator == null) {
                        ReadSettings s = input.settings();
                        coordinator = new RpcConnection(s.coordinator(), s.secret(), s.hostId(), CALL_TIMEOUT_MILLIS,
                                s.tls());
                    }
                    return coordinator.call(method, args);
                } catch (ServiceError e) {
                    if (Contract.ErrorCode.CONNECTION_LOST.equals(e.code()) && attempt == 0) {
                        coordinator.close();
                        coordinator = null;
                        continue;
                    }
                    throw e;
                }
            }
        }

        /** Epoch {@code e}'s exchange now (waiting up to {@code wait} s for its declaration); null: none. */
        private ExchangeDescription exchange(long e, double wait) {
            try {
                return ExchangeDescription.parse(call("get_exchange",
                        Map.of("name", StreamCalls.epochName(input.stream(), e), "wait", wait)));
            } catch (ServiceError err) {
                if (ErrorCodes.NO_EXCHANGE.equals(err.code()) || ErrorCodes.EXCHANGE_LOST.equals(err.code())) {
                    return null;
                }
                throw err;
            }
        }

        /** Epoch {@code e}'s exchange once it is declared; null when the epoch was committed without one (empty). */
        private ExchangeDescription await(long e) {
            while (!stopping) {
                ExchangeDescription d = exchange(e, EPOCH_WAIT_SECONDS);
                if (d != null) {
                    return d;
                }
                JsonNode st = call("stream_describe", Map.of("name", input.stream()));
                if (st.path("last_committed").asLong(-1) >= e) {
                    // committed and not held as an exchange: empty, or released (the plan says which)
                    JsonNode plan = call("stream_plan", Map.of("name", input.stream(), "after", e - 1, "upto", e));
                    if (plan.path("epochs").isEmpty()) {
                        return null;
                    }
                }
            }
            return null;
        }

        private void readEpoch(long e) throws InterruptedException {
            ExchangeDescription d = await(e);
            if (d == null) {
                return;
            }
            long generation = d.epoch;
            long pause = FIRST_LOOK_MILLIS;
            Map<String, RuntimeException> failed = new HashMap<>(); // attempts whose read failed, and why
            while (!stopping) {
                if (d == null || d.epoch != generation || ExchangeState.ABORTED.equals(d.state)) {
                    // the writer's micro-batch was replaced, aborted or dropped: its replay is read, every producer
                    // task's rows taken already skipped
                    stopFetchers();
                    failed.clear();
                    if (d != null && d.epoch == generation) {
                        Thread.sleep(LONGEST_LOOK_MILLIS); // aborted, not yet replaced
                    }
                    d = await(e);
                    if (d == null) {
                        return;
                    }
                    generation = d.epoch;
                    continue;
                }
                boolean changed = follow(e, d, failed);
                if (d.sealed) {
                    finish(e, d);
                    return;
                }
                Thread.sleep(changed ? FIRST_LOOK_MILLIS : pause);
                pause = changed ? FIRST_LOOK_MILLIS : Math.min(LONGEST_LOOK_MILLIS, pause * 2);
                d = exchange(e, 0);
            }
        }

        /**
         * One fetcher per producer task, on the attempt to read: once the epoch is sealed the committed one, before
         * that the one being read while it lives, else another live one. Whether a fetcher started.
         */
        private boolean follow(long e, ExchangeDescription d, Map<String, RuntimeException> failed)
                throws InterruptedException {
            for (Fetcher f : fetchers.values()) {
                if (f.error != null && !f.cancelled) {
                    failed.putIfAbsent(f.producer.partition(), f.error);
                }
            }
            Map<Integer, List<Producer>> candidates = new TreeMap<>();
            for (Producer p : d.sealed ? d.committed : d.registered) {
                if (d.sealed && failed.containsKey(p.partition())) {
                    throw failed.get(p.partition()); // the committed attempt could not be read
                }
                if (!PartitionState.FAILED.equals(p.state()) && !failed.containsKey(p.partition())) {
                    candidates.computeIfAbsent(p.index(), i -> new ArrayList<>()).add(p);
                }
            }
            boolean changed = false;
            for (Map.Entry<Integer, List<Producer>> c : candidates.entrySet()) {
                Fetcher current = fetchers.get(c.getKey());
                if (current != null && c.getValue().stream()
                        .anyMatch(p -> p.partition().equals(current.producer.partition()))) {
                    continue; // the attempt being read is still one to read
                }
                if (current != null) {
                    current.cancel();
                    current.join(); // its buffers reach the queue before any of the next attempt's
                }
                Producer chosen = c.getValue().get(0);
                StreamOffset.Resume r = e == input.start().epoch() ? resumes.remove(Integer.toString(c.getKey())) : null;
                if (r != null) { // the attempt an earlier batch read: go on where it stopped
                    for (Producer p : c.getValue()) {
                        if (p.partition().equals(r.attempt())) {
                            chosen = p;
                        }
                    }
                    if (!chosen.partition().equals(r.attempt())) {
                        r = null; // that attempt is gone (failed, replaced): this one is read from its start
                    }
                }
                Fetcher f = new Fetcher(e, chosen, r);
                fetchers.put(c.getKey(), f);
                f.start();
                changed = true;
            }
            return changed;
        }

        /** The sealed epoch: every committed attempt read to its end. */
        private void finish(long e, ExchangeDescription d) throws InterruptedException {
            for (Producer p : d.committed) {
                Fetcher f = fetchers.get(p.index());
                while (f.isAlive()) {
                    f.join(LONGEST_LOOK_MILLIS);
                    if (stopping) {
                        return;
                    }
                }
                if (f.error != null) {
                    throw f.error;
                }
            }
            stopFetchers();
        }

        /** Cancel every fetcher and wait for each to end (the feeder: what they queued comes before what is next). */
        private void stopFetchers() throws InterruptedException {
            List<Fetcher> all = List.copyOf(fetchers.values());
            cancelFetchers();
            for (Fetcher f : all) {
                f.join();
            }
        }

        /** Cancel every fetcher (interrupted, its connection closed), not waiting. */
        private void cancelFetchers() {
            for (Fetcher f : List.copyOf(fetchers.values())) {
                f.cancel();
            }
            fetchers.clear();
        }
    }

    /**
     * One producer attempt's subpartition from its service under credit, into the task's queue: from its start, or
     * from buffer {@code from.seq()} when an earlier batch's task read this attempt up to there.
     */
    private final class Fetcher extends Thread {
        final long epoch;
        final Producer producer;
        final StreamOffset.Resume from;
        volatile long buffers; // data buffers handed to the task
        volatile RuntimeException error;
        volatile boolean cancelled;
        private volatile RpcConnection conn;

        Fetcher(long epoch, Producer producer, StreamOffset.Resume from) {
            super("sparkflow-stream " + input.stream() + "/" + input.index() + " <- " + producer.partition());
            setDaemon(true);
            this.epoch = epoch;
            this.producer = producer;
            this.from = from;
        }

        void cancel() {
            cancelled = true;
            interrupt();
            RpcConnection c = conn;
            if (c != null) {
                c.close();
            }
        }

        @Override
        public void run() {
            ReadSettings s = input.settings();
            boolean local = producer.hostId().isEmpty() || producer.hostId().equals(s.hostId());
            String address = local && !producer.unix().isEmpty() ? producer.unix() : producer.tcp();
            CreditReceiver credit = new CreditReceiver(1, CREDIT);
            long fromRows = from == null ? 0 : from.rows(); // the attempt's rows before the first buffer to come
            try {
                if (address.isEmpty()) {
                    throw new ExchangeReadException(where(epoch) + ", producer " + producer.partition()
                            + ": its service left no address to read it from");
                }
                conn = new RpcConnection(address, s.secret(), s.hostId(), DATA_TIMEOUT_MILLIS, s.tls());
                if (cancelled) {
                    return;
                }
                conn.send(from == null ? credit.request(producer.partition(), input.index())
                        : credit.resumeAt(producer.partition(), input.index(), from.seq()));
                boolean resuming = from != null;
                while (!cancelled) {
                    Frames.Frame frame = conn.receive();
                    if (frame.type() == Frames.ERROR_RESPONSE) {
                        JsonNode answer = MAPPER.readTree(frame.header());
                        if (resuming && buffers == 0 && ErrorCodes.BAD_REQUEST.equals(answer.path("code").asText())) {
                            // the service does not hold that place (any more): read the attempt from its start
                            LOG.warn("{}, producer {}: its service cannot resume at buffer {} ({}); reading it from "
                                    + "its start, skipping the rows taken", where(epoch), producer.partition(),
                                    from.seq(), answer.path("message").asText());
                            resuming = false;
                            credit = new CreditReceiver(2, CREDIT);
                            fromRows = 0;
                            conn.send(credit.request(producer.partition(), input.index()));
                            continue;
                        }
                        throw new ExchangeReadException(where(epoch) + ", producer " + producer.partition()
                                + ": its service answered: " + answer.path("message").asText());
                    }
                    if (frame.type() != Frames.BUFFER_RESPONSE) {
                        continue;
                    }
                    CreditReceiver.Buffer b = credit.onBuffer(frame);
                    if (b.kind() == SpillIndex.END_OF_PARTITION) {
                        // a resumed read has not seen the buffers before its start: the producer's count is checked
                        // by reads from the start
                        if (b.payload().length == Contract.Buffer.END_COUNTS_SIZE && !resuming) {
                            long stored = ByteBuffer.wrap(b.payload()).getLong(0);
                            if (stored != buffers) {
                                throw new ExchangeReadException("lost data in " + where(epoch) + ", producer "
                                        + producer.partition() + ": read " + buffers + " buffers, its producer stored "
                                        + stored);
                            }
                        }
                        return;
                    }
                    if (b.kind() == SpillIndex.DATA) {
                        queue.put(new Item(Kind.DATA, epoch, Integer.toString(producer.index()), producer.partition(),
                                b.seq(), buffers == 0 ? fromRows : -1, b.payload(), System.currentTimeMillis(), null));
                        buffers++;
                        conn.send(credit.consumed());
                    }
                }
            } catch (InterruptedException stopped) {
                // cancelled
            } catch (RuntimeException | IOException e) {
                if (!cancelled) {
                    error = e instanceof ExchangeReadException r ? r : new ExchangeReadException("lost data in "
                            + where(epoch) + ", producer " + producer.partition() + ": " + e.getMessage(), e);
                }
            } finally {
                RpcConnection c = conn;
                if (c != null) {
                    c.close();
                }
            }
        }
    }
}
