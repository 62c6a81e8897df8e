package org.sparkflow.exchange.write;

import java.util.ArrayDeque;

/**
 * Where a writer's full buffers are encoded (compressed) and pushed: on the task's own thread (inline), or on one
 * worker thread of this writer behind a queue bounded by bytes, so the task goes on filling vectors while the last
 * buffer is compressed and waits for credit. One worker takes the buffers in the order they were handed over, so each
 * subpartition's buffers reach the service in their order (the service and readers count them by producer, attempt
 * and sequence). The queue holds at most {@code maxBytes} of buffers still to push (the one being pushed counted; one
 * buffer is always taken, whatever its size): a task that fills faster than buffers leave waits (backpressure, the
 * service's credit reaching the task). A failure of the worker is kept and thrown on the task's thread by its next
 * {@link #submit}, {@link #drain} or {@link #check}, the same exception; buffers queued after it are dropped.
 * {@link #stop} drops what is queued and lets the worker end; {@link #awaitEnd} waits for it.
 */
final class PushStage {
    /** Where an encoded buffer goes ({@code ProducerConnection#push}). */
    interface Sink {
        void push(int subpartition, byte[] payload, int flags);
    }

    /** A full buffer handed over: {@link #encode} once (its memory is given back then, whatever happens) or {@link #discard}. */
    interface Job {
        byte[] encode();

        void discard();
    }

    private record Entry(int subpartition, int flags, long bytes, Job job) {}

    private final Sink sink;
    private final long maxBytes;
    private final Thread worker; // null: inline
    private final ArrayDeque<Entry> queue = new ArrayDeque<>();
    private long queuedBytes; // queued and the one being pushed
    private boolean busy; // the worker holds a buffer it took
    private boolean stopping;
    private volatile RuntimeException failure;
    private long workerCpuNanos; // the worker's CPU time encoding and pushing, and the bytes it took for it
    private long workerBytes;

    /**
     * {@code background}: a worker thread named {@code name} (a daemon: it never holds the JVM); else every buffer is
     * encoded and pushed by {@link #submit}'s caller.
     */
    PushStage(String name, Sink sink, long maxBytes, boolean background) {
        this.sink = sink;
        this.maxBytes = maxBytes;
        if (background) {
            worker = new Thread(this::run, name);
            worker.setDaemon(true);
            worker.start();
        } else {
            worker = null;
        }
    }

    /**
     * Hand over one buffer of about {@code bytes} for {@code subpartition}, waiting while the queue is full; inline:
     * encode and push it now. Throws the worker's failure instead (the job is discarded then).
     */
    void submit(int subpartition, int flags, long bytes, Job job) {
        if (worker == null) {
            byte[] payload = job.encode();
            sink.push(subpartition, payload, flags);
            return;
        }
        synchronized (this) {
            while (failure == null && !stopping && queuedBytes > 0 && queuedBytes + bytes > maxBytes) {
                try {
                    wait();
                } catch (InterruptedException e) {
                    job.discard();
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while waiting for the writer's buffers to be pushed", e);
                }
            }
            if (failure != null || stopping) {
                job.discard();
                check();
                throw new IllegalStateException("the writer's push stage was stopped");
            }
            queue.addLast(new Entry(subpartition, flags, bytes, job));
            queuedBytes += bytes;
            notifyAll();
        }
    }

    /** Wait until every buffer handed over is pushed; the worker's failure if it failed (or if it was stopped). */
    void drain() {
        if (worker == null) {
            return;
        }
        boolean stopped;
        synchronized (this) {
            while (failure == null && !stopping && (busy || !queue.isEmpty())) {
                waitInterruptibly();
            }
            stopped = stopping;
        }
        check();
        if (stopped) {
            throw new IllegalStateException("the writer's push stage was stopped");
        }
    }

    /** The worker's failure, thrown on the caller's thread as it was thrown on the worker's; else nothing. */
    void check() {
        RuntimeException f = failure;
        if (f != null) {
            throw f;
        }
    }

    /** Buffers handed over and not yet pushed, in bytes (the one being pushed counted). */
    synchronized long queuedBytes() {
        return queuedBytes;
    }

    /**
     * What encoding and pushing {@code bytes} costs the worker in CPU time, by what it spent per byte so far (0
     * inline, or before its first buffer): a timed flush counts it as its own cost, though another thread spends it.
     */
    synchronized long workerCpuNanos(long bytes) {
        return workerBytes == 0 ? 0 : (long) ((double) workerCpuNanos / workerBytes * bytes);
    }

    /** Drop what is queued (its memory given back) and let the worker end once its current buffer is done. */
    void stop() {
        synchronized (this) {
            stopping = true;
        }
        discardQueued();
    }

    /** Wait up to {@code millis} for the worker to end (after {@link #stop}); whether it has (inline: true). */
    boolean awaitEnd(long millis) {
        if (worker == null) {
            return true;
        }
        try {
            worker.join(Math.max(1, millis));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return !worker.isAlive();
    }

    private void waitInterruptibly() {
        try {
            wait();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while waiting for the writer's buffers to be pushed", e);
        }
    }

    private void run() {
        while (true) {
            Entry e;
            synchronized (this) {
                while (queue.isEmpty() && !stopping) {
                    try {
                        wait();
                    } catch (InterruptedException ignored) {
                        // only stop() ends the worker
                    }
                }
                if (stopping) {
                    return;
                }
                e = queue.removeFirst();
                busy = true;
            }
            long cpu = ExchangeDataWriter.threadCpuNanos();
            try {
                sink.push(e.subpartition, e.job.encode(), e.flags);
                long spent = ExchangeDataWriter.threadCpuNanos() - cpu;
                synchronized (this) {
                    workerCpuNanos += cpu >= 0 ? spent : 0;
                    workerBytes += e.bytes;
                }
            } catch (RuntimeException | Error t) {
                fail(t instanceof RuntimeException r ? r : new IllegalStateException(t.toString(), t));
                return;
            } finally {
                synchronized (this) {
                    busy = false;
                    queuedBytes -= e.bytes;
                    notifyAll();
                }
            }
        }
    }

    private void fail(RuntimeException t) {
        synchronized (this) {
            failure = t;
        }
        discardQueued();
    }

    /** Empty the queue (its bytes no longer counted, waiters woken), then discard what it held. */
    private void discardQueued() {
        ArrayDeque<Entry> dropped;
        synchronized (this) {
            dropped = new ArrayDeque<>(queue);
            queuedBytes -= dropped.stream().mapToLong(e -> e.bytes).sum();
            queue.clear();
            notifyAll();
        }
        for (Entry e : dropped) {
            e.job.discard();
        }
    }
}
