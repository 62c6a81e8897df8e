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
import org.sparkflow.exchange.wire.Tls;

/**
 * One producer's subpartition read from its exchange service under credit: a partition request on an
 * authenticated connection, buffers in sequence, one credit back per decoded data buffer, then the end of
 * partition with its counts. For producers whose spill file is not readable here (another host). A partition with
 * replicas (the {@code replicas} write option) is read on from the next replica, at the buffer due, when its service
 * cannot be reached or the connection to it is lost: no buffer is lost or repeated.
 */
final class RemoteProducer implements ProducerSource {
    static final int INITIAL_CREDIT = 4;
    static final int TIMEOUT_MILLIS = 300_000; // a service under load may take long for the next buffer
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private final Producer producer;
    private final int subpartition;
    private final String secret;
    private final String hostId;
    private final Tls tls;
    private final ArrayDeque<String> replicas = new ArrayDeque<>(); // where to go on when the service is lost
    private final List<String> left = new ArrayList<>(); // the services this read left, and why
    private RpcConnection conn;
    private final CreditReceiver credit = new CreditReceiver(1, INITIAL_CREDIT);
    private BufferDecoder landingFor; // the decoder whose Arrow memory data buffers are received into
    private boolean ended;
    private long buffersRead;
    private long rowsRead;
    private long buffersStored = -1;
    private long rowsStored = -1;

    RemoteProducer(Producer producer, String address, int subpartition, String secret, String hostId, Tls tls) {
        this.producer = producer;
        this.subpartition = subpartition;
        this.secret = secret;
        this.hostId = hostId;
        this.tls = tls;
        for (ExchangeDescription.Replica r : producer.replicas()) {
            replicas.add(r.hostId().equals(hostId) && !r.unix().isEmpty() ? r.unix() : r.tcp());
        }
        connect(address, false);
    }

    /** Ask {@code address} for the partition, from the start or ({@code resume}) from the next buffer due. */
    private void connect(String address, boolean resume) {
        while (true) {
            RpcConnection c = null;
            try {
                c = new RpcConnection(address, secret, hostId, TIMEOUT_MILLIS, tls);
                c.send(resume ? credit.resume(producer.partition(), subpartition)
                        : credit.request(producer.partition(), subpartition));
                if (landingFor != null) {
                    c.payloadSink(sink(landingFor));
                }
                conn = c;
                return;
            } catch (ServiceError e) {
                if (c != null) {
                    c.close();
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
    private void giveBack() {
        byte[] frame = credit.consumed();
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
        conn.close();
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
        while (!ended) {
            Frames.Frame frame = receive();
            if (frame.type() == Frames.ERROR_RESPONSE) {
                JsonNode error = MAPPER.readTree(frame.header());
                throw new IOException("its service at " + conn.address() + " answered: " + error.path("message").asText());
            }
            if (frame.type() != Frames.BUFFER_RESPONSE) {
                continue; // nothing else is for this reader
            }
            try {
                int rows = take(frame, decoder);
                if (rows != NOT_DATA) {
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

    private static final int NOT_DATA = -2;

    /** One BUFFER_RESPONSE: a data buffer's rows, -1 at the end of the partition, {@link #NOT_DATA} for a marker. */
    private int take(Frames.Frame frame, BufferDecoder decoder) throws IOException, BufferDecoder.CorruptBuffer {
        CreditReceiver.Buffer buffer;
        try {
            buffer = credit.onBuffer(frame);
        } catch (IllegalStateException e) {
            throw new IOException(e.getMessage());
        }
        if (buffer.kind() == SpillIndex.END_OF_PARTITION) {
            ended = true;
            if (buffer.payload().length == ProducerFile.END_COUNTS) {
                ByteBuffer counts = ByteBuffer.wrap(buffer.payload());
                buffersStored = counts.getLong(0);
                rowsStored = counts.getLong(8);
            }
            return -1;
        }
        if (buffer.kind() != SpillIndex.DATA) {
            return NOT_DATA;
        }
        int rows = buffer.landed() != null ? decoder.load(buffer.landed()) : decoder.load(buffer.payload());
        buffersRead++;
        rowsRead += rows;
        giveBack();
        return rows;
    }

    @Override
    public long rowsRead() {
        return rowsRead;
    }

    @Override
    public String countsMismatch() {
        return ProducerSource.mismatch(buffersRead, rowsRead, buffersStored, rowsStored);
    }

    @Override
    public void close() {
        if (!ended) {
            try {
                conn.send(credit.cancel());
            } catch (RuntimeException ignored) {
                // the connection is going anyway
            }
        }
        conn.close();
    }
}
