package org.sparkflow.exchange.read;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import org.sparkflow.exchange.contract.Contract.ErrorCode;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.wire.Frames;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * A read partition's subpartitions of one producer, read from its exchange service under credit, all at once: one
 * authenticated connection (the task's to that service, kept between producers by {@link ServiceConnections}), one
 * partition request (one input channel, Flink's RemoteInputChannel) per subpartition
 * multiplexed on it by receiver id, each with its own credit; buffers are taken in the order they arrive, so no
 * subpartition waits behind another while the producer writes (Flink's input gate). Each channel checks its
 * sequence and its end-of-partition counts; one credit goes back per decoded data buffer. A partition with replicas
 * (the {@code replicas} write option) is read on from the next replica, every channel at the buffer it reached, when
 * its service cannot be reached or the connection to it is lost: no buffer is lost or repeated.
 */
final class RemoteProducer implements ProducerSource {
    static final int INITIAL_CREDIT = 4;
    static final int TIMEOUT_MILLIS = 300_000; // a service under load may take long for the next buffer
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private final Producer producer;
    private final String secret;
    private final String hostId;
    private final org.sparkflow.exchange.wire.Tls tls;
    private final ArrayDeque<String> replicas = new ArrayDeque<>(); // where to go on when the service is lost
    private final List<String> left = new ArrayList<>(); // the services this read left, and why
    private final Channel[] channels;
    private final ServiceConnections connections;
    private RpcConnection conn;
    private long firstReceiver; // channel i is receiver firstReceiver + i on conn
    private BufferDecoder landingFor; // the decoder whose Arrow memory data buffers are received into
    private int open; // channels before their end of partition
    private long rowsRead;

    /** One subpartition's channel: its credit and what it read and was told it holds. */
    private static final class Channel {
        final int subpartition;
        boolean ended;
        long buffersRead;
        long rowsRead;
        long buffersStored = -1;
        long rowsStored = -1;

        Channel(int subpartition) {
            this.subpartition = subpartition;
        }

        CreditReceiver credit;
    }

    RemoteProducer(Producer producer, String address, int[] subpartitions, String secret, String hostId,
                   org.sparkflow.exchange.wire.Tls tls) {
        this(producer, address, subpartitions, secret, hostId, tls, new ServiceConnections());
    }

    RemoteProducer(Producer producer, String address, int[] subpartitions, String secret, String hostId,
                   org.sparkflow.exchange.wire.Tls tls, ServiceConnections connections) {
        if (subpartitions.length == 0) {
            throw new IllegalArgumentException("a read of producer " + producer.partition() + " names no subpartition");
        }
        this.producer = producer;
        this.secret = secret;
        this.hostId = hostId;
        this.tls = tls;
        this.connections = connections;
        this.channels = new Channel[subpartitions.length];
        for (int i = 0; i < subpartitions.length; i++) {
            channels[i] = new Channel(subpartitions[i]);
        }
        open = channels.length;
        for (ExchangeDescription.Replica r : producer.replicas()) {
            replicas.add(r.hostId().equals(hostId) && !r.unix().isEmpty() ? r.unix() : r.tcp());
        }
        connect(address, false);
    }

    /**
     * Ask {@code address} for every open channel, from the start or ({@code resume}) from the next buffer due, each
     * under a receiver id new on the connection. A kept connection that fails gives way to a new one at once.
     */
    private void connect(String address, boolean resume) {
        while (true) {
            RpcConnection c = null;
            try {
                c = connections.take(address, secret, hostId, TIMEOUT_MILLIS, tls);
                boolean kept = connections.reused(c);
                try {
                    ask(c, resume);
                } catch (ServiceError stale) {
                    if (!kept) {
                        throw stale;
                    }
                    connections.discard(c);
                    c = connections.take(address, secret, hostId, TIMEOUT_MILLIS, tls);
                    ask(c, resume);
                }
                if (landingFor != null) {
                    c.payloadSink(sink(landingFor));
                }
                conn = c;
                return;
            } catch (ServiceError e) {
                if (c != null) {
                    connections.discard(c);
                }
                if (replicas.isEmpty()) {
                    throw withLeft(e);
                }
                left.add(address + ": " + e.getMessage());
                address = replicas.poll();
                resume = true;
            }
        }
    }

    /** The partition requests of every open channel on {@code c}, under receiver ids new on it. */
    private void ask(RpcConnection c, boolean resume) {
        firstReceiver = connections.receivers(c, channels.length);
        for (int i = 0; i < channels.length; i++) {
            Channel ch = channels[i];
            if (ch.ended) {
                continue;
            }
            CreditReceiver old = ch.credit;
            ch.credit = old == null ? new CreditReceiver(firstReceiver + i, INITIAL_CREDIT)
                    : old.onReceiver(firstReceiver + i);
            c.send(resume ? ch.credit.resume(producer.partition(), ch.subpartition)
                    : ch.credit.request(producer.partition(), ch.subpartition));
        }
    }

    private ServiceError withLeft(ServiceError e) {
        return left.isEmpty() ? e : ErrorCodes.error(e.code(), e.getMessage() + " (after the partition's replicas "
                + "were tried: " + String.join("; ", left) + ")", e);
    }

    /** The next frame; when the connection is lost, the same from the next replica, at the sequence reached. */
    private Frames.Frame receive() {
        while (true) {
            try {
                return conn.receive();
            } catch (ServiceError e) {
                failOver(e);
            }
        }
    }

    /** One buffer's credit back; a lost connection goes on from the next replica (the credit announced there). */
    private void giveBack(Channel ch) {
        byte[] frame = ch.credit.consumed();
        try {
            conn.send(frame);
        } catch (ServiceError e) {
            failOver(e);
        }
    }

    /** Go on from the next replica after {@code e}, or throw it when it is no lost service or none is left. */
    private void failOver(ServiceError e) {
        boolean gone = ErrorCode.CONNECTION_LOST.equals(e.code()) || ErrorCode.TIMEOUT.equals(e.code());
        if (replicas.isEmpty() || !gone) { // TIMEOUT: a host that vanished without a word, at the read's timeout
            throw withLeft(e);
        }
        connections.discard(conn);
        left.add(conn.address() + ": " + e.getMessage());
        connect(replicas.poll(), true);
    }

    @Override
    public Producer producer() {
        return producer;
    }

    /** Data buffers land in {@code decoder}'s Arrow memory, straight from the socket; anything else in byte arrays. */
    private static Frames.PayloadSink sink(BufferDecoder decoder) {
        return (type, header, length) -> type == Frames.BUFFER_RESPONSE && header.length == CreditReceiver.HEADER
                && (header[20] & 0xff) == SpillIndex.DATA ? decoder.landing(length) : null;
    }

    @Override
    public int next(BufferDecoder decoder) throws IOException, BufferDecoder.CorruptBuffer {
        if (landingFor != decoder) {
            landingFor = decoder;
            conn.payloadSink(sink(decoder));
        }
        while (open > 0) {
            Frames.Frame frame = receive();
            if (frame.type() == Frames.ERROR_RESPONSE) {
                JsonNode error = MAPPER.readTree(frame.header());
                Channel ch = channelOf(error.path("receiver_id").asLong(-1));
                throw new IOException("its service at " + conn.address() + " answered"
                        + (ch == null ? "" : " for subpartition " + ch.subpartition) + ": "
                        + error.path("message").asText());
            }
            if (frame.type() != Frames.BUFFER_RESPONSE) {
                continue; // nothing else is for this reader
            }
            try {
                int rows = take(frame, decoder);
                if (rows >= 0) {
                    return rows;
                }
            } finally {
                if (frame.landed() != null) {
                    frame.landed().close(); // the decoded vectors hold what they need of it
                }
            }
        }
        return -1;
    }

    private Channel channelOf(long receiverId) {
        long i = receiverId - firstReceiver;
        return i >= 0 && i < channels.length ? channels[(int) i] : null;
    }

    private static final int NOT_DATA = -2;

    /** One BUFFER_RESPONSE: a data buffer's rows, else {@link #NOT_DATA} (an end of partition, a marker). */
    private int take(Frames.Frame frame, BufferDecoder decoder) throws IOException, BufferDecoder.CorruptBuffer {
        if (frame.header().length != CreditReceiver.HEADER) {
            throw new IOException("a buffer response with a header of " + frame.header().length + " bytes");
        }
        Channel ch = channelOf(ByteBuffer.wrap(frame.header()).getLong(0));
        if (ch == null || ch.ended) {
            throw new IOException("a buffer for receiver " + ByteBuffer.wrap(frame.header()).getLong(0) + ", which "
                    + (ch == null ? "this read never asked for" : "had ended") + ", arrived from its service");
        }
        CreditReceiver.Buffer buffer;
        try {
            buffer = ch.credit.onBuffer(frame);
        } catch (IllegalStateException e) {
            throw new IOException("subpartition " + ch.subpartition + ": " + e.getMessage());
        }
        if (buffer.kind() == SpillIndex.END_OF_PARTITION) {
            ch.ended = true;
            open--;
            if (buffer.payload().length == ProducerFile.END_COUNTS) {
                ByteBuffer counts = ByteBuffer.wrap(buffer.payload());
                ch.buffersStored = counts.getLong(0);
                ch.rowsStored = counts.getLong(8);
            }
            return NOT_DATA;
        }
        if (buffer.kind() != SpillIndex.DATA) {
            return NOT_DATA;
        }
        int rows = buffer.landed() != null ? decoder.load(buffer.landed()) : decoder.load(buffer.payload());
        ch.buffersRead++;
        ch.rowsRead += rows;
        rowsRead += rows;
        giveBack(ch);
        return rows;
    }

    @Override
    public long rowsRead() {
        return rowsRead;
    }

    @Override
    public String countsMismatch() {
        for (Channel ch : channels) {
            String mismatch = ProducerSource.mismatch(ch.buffersRead, ch.rowsRead, ch.buffersStored, ch.rowsStored);
            if (mismatch != null) {
                return "subpartition " + ch.subpartition + ": " + mismatch;
            }
        }
        return null;
    }

    @Override
    public void close() {
        if (open == 0) {
            connections.giveBack(conn); // nothing more comes for this producer: the next one may use it
            return;
        }
        for (Channel ch : channels) {
            if (!ch.ended) {
                try {
                    conn.send(ch.credit.cancel());
                } catch (RuntimeException ignored) {
                    // the connection is going anyway
                }
            }
        }
        connections.discard(conn);
    }
}
