package org.sparkflow.exchange.read;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.ByteBuffer;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.contract.Contract.PartitionRequestField;
import org.sparkflow.exchange.wire.Frames;

/**
 * A reader's side of one partition request under credit, sans-IO ({@code consumer/input_channel.py}): the request
 * announcing {@code initialCredit} empty buffers, each received buffer checked to be the next in sequence, and one
 * credit given back for each data buffer once it is decoded. Events (end of partition, markers) need no credit.
 */
public final class CreditReceiver {
    /**
     * One BUFFER_RESPONSE: {@code receiver:i64 seq:i64 backlog:i32 kind:u8 flags:u8}, then the payload;
     * {@code landed}: the payload's memory when the connection received it into a {@link Frames.PayloadSink}'s (then
     * {@code payload} is empty), else null.
     */
    public record Buffer(long seq, int kind, int flags, byte[] payload, Frames.Landing landed) {
        public Buffer(long seq, int kind, int flags, byte[] payload) {
            this(seq, kind, flags, payload, null);
        }
    }

    static final int HEADER = Contract.DataHeaderSize.BUFFER_RESPONSE;
    static final int FLAG_SHARED = Contract.BufferFlag.SHARED;
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private final long receiverId;
    private final int initialCredit;
    private long nextSeq;
    private int credit;

    public CreditReceiver(long receiverId, int initialCredit) {
        this.receiverId = receiverId;
        this.initialCredit = initialCredit;
        this.credit = initialCredit;
    }

    /**
     * The same channel under another receiver id (on the connection it goes on from after a lost one): its position
     * and the credit it has not used are kept, so {@link #resume} asks for exactly the buffers still due.
     */
    public CreditReceiver onReceiver(long receiverId) {
        CreditReceiver moved = new CreditReceiver(receiverId, initialCredit);
        moved.nextSeq = nextSeq;
        moved.credit = credit;
        return moved;
    }

    /** The PARTITION_REQUEST for one subpartition of {@code partition}, over the socket (never shared memory). */
    public byte[] request(String partition, int subpartition) {
        return Frames.encode(Frames.PARTITION_REQUEST,
                header(partition, subpartition, initialCredit, 0, null).toString());
    }

    /**
     * The PARTITION_REQUEST that goes on from the next buffer due, on another connection (a replica's service): the
     * credit not in use is announced again, so no buffer is lost or repeated.
     */
    public byte[] resume(String partition, int subpartition) {
        return Frames.encode(Frames.PARTITION_REQUEST,
                header(partition, subpartition, credit, nextSeq, null).toString());
    }

    /**
     * The PARTITION_REQUEST of a new read going on where an earlier one of the same partition (producer attempt)
     * stopped: its first buffer is {@code seq}, which the service must hold (else it refuses the request as a bad
     * one, at once); the buffers before it are not sent again.
     */
    public byte[] resumeAt(String partition, int subpartition, long seq) {
        if (seq < 0) {
            throw new IllegalArgumentException("a resume position is a buffer sequence number, not " + seq);
        }
        nextSeq = seq;
        return Frames.encode(Frames.PARTITION_REQUEST, header(partition, subpartition, credit, 0, seq).toString());
    }

    private ObjectNode header(String partition, int subpartition, int initialCredit, long resumeFrom,
                              Long resumeAt) {
        ObjectNode msg = MAPPER.createObjectNode();
        msg.put(PartitionRequestField.PARTITION, partition);
        msg.put(PartitionRequestField.SUBPARTITION, subpartition);
        msg.put(PartitionRequestField.RECEIVER_ID, receiverId);
        msg.put(PartitionRequestField.INITIAL_CREDIT, initialCredit);
        msg.put(PartitionRequestField.RESUME_FROM, resumeFrom);
        msg.put(PartitionRequestField.SHARED, false);
        msg.putNull(PartitionRequestField.SUBPARTITION_END);
        if (resumeAt == null) {
            msg.putNull(PartitionRequestField.RESUME_AT);
        } else {
            msg.put(PartitionRequestField.RESUME_AT, resumeAt);
        }
        return msg;
    }

    /** A received BUFFER_RESPONSE, checked: ours, the next in sequence, within the credit given. */
    public Buffer onBuffer(Frames.Frame frame) {
        if (frame.header().length != HEADER) {
            throw new IllegalStateException("a buffer response with a header of " + frame.header().length + " bytes");
        }
        ByteBuffer h = ByteBuffer.wrap(frame.header());
        long receiver = h.getLong(0);
        long seq = h.getLong(8);
        int kind = h.get(20) & 0xff;
        int flags = h.get(21) & 0xff;
        if (receiver != receiverId) {
            throw new IllegalStateException("a buffer for receiver " + receiver + " arrived on receiver " + receiverId);
        }
        if (seq != nextSeq) {
            throw new IllegalStateException("buffers " + (seq > nextSeq ? "lost" : "duplicated") + " on the way from "
                    + "the service: buffer " + seq + " arrived where buffer " + nextSeq + " was due");
        }
        if ((flags & FLAG_SHARED) != 0) {
            throw new IllegalStateException("the service sent a shared-memory buffer to a reader that asked for none");
        }
        if (kind == SpillIndex.DATA && credit-- <= 0) {
            throw new IllegalStateException("the service sent a data buffer without credit");
        }
        nextSeq++;
        return new Buffer(seq, kind, flags, frame.payload(), frame.landed());
    }

    /** The ADD_CREDIT frame giving back one buffer the reader is done with. */
    public byte[] consumed() {
        credit++;
        return Frames.encode(Frames.ADD_CREDIT, ByteBuffer.allocate(Contract.DataHeaderSize.ADD_CREDIT).putLong(receiverId).putInt(1).array());
    }

    /** The frame cancelling the request (the service then lets go of its view). */
    public byte[] cancel() {
        ObjectNode msg = MAPPER.createObjectNode();
        msg.put("receiver_id", receiverId);
        return Frames.encode(Frames.CANCEL_PARTITION_REQUEST, msg.toString());
    }
}
