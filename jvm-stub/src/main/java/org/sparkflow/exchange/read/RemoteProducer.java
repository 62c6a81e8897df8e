package org.sparkflow.exchange.read;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.ByteBuffer;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.wire.Frames;
import org.sparkflow.exchange.wire.RpcConnection;
import org.sparkflow.exchange.wire.Tls;

/**
 * One producer's subpartition read from its exchange service under credit: a partition request on an
 * authenticated connection, buffers in sequence, one credit back per decoded data buffer, then the end of
 * partition with its counts. For producers whose spill file is not readable here (another host).
 */
final class RemoteProducer implements ProducerSource {
    static final int INITIAL_CREDIT = 4;
    static final int TIMEOUT_MILLIS = 300_000; // a service under load may take long for the next buffer
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private final Producer producer;
    private final RpcConnection conn;
    private final CreditReceiver credit = new CreditReceiver(1, INITIAL_CREDIT);
    private boolean ended;
    private long buffersRead;
    private long rowsRead;
    private long buffersStored = -1;
    private long rowsStored = -1;

    RemoteProducer(Producer producer, String address, int subpartition, String secret, String hostId, Tls tls) {
        this.producer = producer;
        this.conn = new RpcConnection(address, secret, hostId, TIMEOUT_MILLIS, tls);
        try {
            conn.send(credit.request(producer.partition(), subpartition));
        } catch (RuntimeException e) {
            conn.close();
            throw e;
        }
    }

    @Override
    public Producer producer() {
        return producer;
    }

    @Override
    public int next(BufferDecoder decoder) throws IOException, BufferDecoder.CorruptBuffer {
        while (!ended) {
            Frames.Frame frame = conn.receive();
            if (frame.type() == Frames.ERROR_RESPONSE) {
                JsonNode error = MAPPER.readTree(frame.header());
                throw new IOException("its service at " + conn.address() + " answered: " + error.path("message").asText());
            }
            if (frame.type() != Frames.BUFFER_RESPONSE) {
                continue; // nothing else is for this reader
            }
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
            if (buffer.kind() == SpillIndex.DATA) {
                int rows = decoder.load(buffer.payload());
                buffersRead++;
                rowsRead += rows;
                conn.send(credit.consumed());
                return rows;
            }
        }
        return -1;
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
