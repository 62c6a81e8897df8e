package org.sparkflow.exchange.read;

import java.io.IOException;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;

/** Where one producer's subpartition comes from (its spill file here, or its service under credit). */
interface ProducerSource extends AutoCloseable {
    Producer producer();

    /** Load the next data buffer into {@code decoder}; its rows, or -1 after the end of partition. */
    int next(BufferDecoder decoder) throws IOException, BufferDecoder.CorruptBuffer;

    /** Rows read so far. */
    long rowsRead();

    /** Null when every buffer and row the producer stored was read, else what differs (after the end). */
    String countsMismatch();

    @Override
    void close() throws IOException;

    /** The end-of-partition check ({@code input_gate._check_counts}); stored counts -1: not known. */
    static String mismatch(long buffersRead, long rowsRead, long buffersStored, long rowsStored) {
        if (buffersStored < 0) {
            return null; // written before counts existed
        }
        if (buffersRead != buffersStored || (rowsStored >= 0 && rowsRead != rowsStored)) {
            return "read " + buffersRead + " buffers and " + rowsRead + " rows, its producer stored " + buffersStored
                    + " buffers" + (rowsStored >= 0 ? " and " + rowsStored + " rows" : "");
        }
        return null;
    }
}
