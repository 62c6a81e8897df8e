package org.sparkflow.exchange.wire;

import org.sparkflow.exchange.contract.Contract;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.sparkflow.exchange.errors.ErrorCodes;

/**
 * The wire protocol's framing, sans-IO (the same layout as {@code network/protocol.py}):
 * {@code length:u32 | magic:u32 | version:u8 | type:u8 | header_len:u32 | header | payload}, big endian,
 * {@code length} counting every byte after itself. Control messages carry a JSON header.
 */
public final class Frames {
    // the numbers come from the contract (sparkflow_exchange/contract.json), as protocol.py's are checked against it
    public static final int MAGIC = Contract.Frame.MAGIC; // "SFXE"
    public static final byte VERSION = Contract.Frame.VERSION; // 2: proofs cover both nonces and the service id
    public static final int PREFIX_SIZE = Contract.Frame.PREFIX_SIZE;
    public static final int SERVER_HELLO = Contract.MessageType.SERVER_HELLO;
    public static final int HELLO = Contract.MessageType.HELLO;
    public static final int WELCOME = Contract.MessageType.WELCOME;
    public static final int PARTITION_REQUEST = Contract.MessageType.PARTITION_REQUEST;
    public static final int ADD_CREDIT = Contract.MessageType.ADD_CREDIT;
    public static final int CANCEL_PARTITION_REQUEST = Contract.MessageType.CANCEL_PARTITION_REQUEST;
    public static final int BUFFER_RESPONSE = Contract.MessageType.BUFFER_RESPONSE;
    public static final int ERROR_RESPONSE = Contract.MessageType.ERROR_RESPONSE;
    public static final int REGISTER_PARTITION = Contract.MessageType.REGISTER_PARTITION;
    public static final int PARTITION_REGISTERED = Contract.MessageType.PARTITION_REGISTERED;
    public static final int PUSH_BUFFER = Contract.MessageType.PUSH_BUFFER;
    public static final int PRODUCER_CREDIT = Contract.MessageType.PRODUCER_CREDIT;
    public static final int FINISH_PARTITION = Contract.MessageType.FINISH_PARTITION;
    public static final int FAIL_PARTITION = Contract.MessageType.FAIL_PARTITION;
    public static final int PARTITION_FINISHED = Contract.MessageType.PARTITION_FINISHED;
    public static final int RPC_REQUEST = Contract.MessageType.RPC_REQUEST;
    public static final int RPC_RESPONSE = Contract.MessageType.RPC_RESPONSE;
    public static final int NOTIFY = Contract.MessageType.NOTIFY;
    public static final int PARTITION_RELEASED = Contract.MessageType.PARTITION_RELEASED;

    private Frames() {}

    private static final byte[] EMPTY = new byte[0];

    /**
     * Memory a frame's payload was received into in place of a byte array (a reader's Arrow memory, so a data
     * buffer is copied once, from the socket into where it is decoded); whoever takes the frame closes it.
     */
    public interface Landing extends AutoCloseable {
        /** The payload's bytes: position 0, limit its length. */
        ByteBuffer bytes();

        @Override
        void close();
    }

    /** Where a frame's payload lands, asked once its header is in: null for a new byte array. */
    @FunctionalInterface
    public interface PayloadSink {
        Landing land(int type, byte[] header, int length);
    }

    /**
     * One received frame: its type, JSON header and payload; {@code landed}: the payload's memory when a
     * {@link PayloadSink} took it (then {@code payload} is empty), else null.
     */
    public record Frame(int type, byte[] header, byte[] payload, Landing landed) {
        public Frame(int type, byte[] header, byte[] payload) {
            this(type, header, payload, null);
        }

        public String headerText() {
            return new String(header, StandardCharsets.UTF_8);
        }
    }

    /** A control message: prefix and JSON header, no payload. */
    public static byte[] encode(int type, String jsonHeader) {
        return encode(type, jsonHeader.getBytes(StandardCharsets.UTF_8));
    }

    /** A message with a binary header (data messages: credit), no payload. */
    public static byte[] encode(int type, byte[] header) {
        return encode(type, header, 0);
    }

    /** Prefix and binary header of a message whose {@code payloadLength} bytes are sent right after them. */
    public static byte[] encode(int type, byte[] header, int payloadLength) {
        ByteBuffer out = ByteBuffer.allocate(PREFIX_SIZE + header.length);
        out.putInt(PREFIX_SIZE - 4 + header.length + payloadLength).putInt(MAGIC).put(VERSION).put((byte) type)
                .putInt(header.length).put(header);
        return out.array();
    }

    /**
     * Incremental decoder: feed bytes as they arrive, take the frames they complete. Once a frame's prefix is in, its
     * header and payload are allocated at their final size and filled in place: a large buffer arriving in many
     * reads is copied once, never gathered and compacted again on every read (which cost a reader more than the
     * socket did).
     */
    public static final class Decoder {
        private final int maxFrame;
        private final byte[] prefix = new byte[PREFIX_SIZE];
        private int prefixFilled;
        private int type;
        private byte[] header; // null: the next frame's prefix is being read
        private int payloadLength;
        private byte[] payload; // null until the header is in (then a byte array, or EMPTY when landed)
        private Landing landing;
        private ByteBuffer landed; // landing's bytes
        private int filled; // bytes of header, then payload, received
        private PayloadSink sink;

        public Decoder(int maxFrame) {
            this.maxFrame = maxFrame;
        }

        /** Payloads from now on land where {@code sink} says (null: byte arrays). */
        public void sink(PayloadSink sink) {
            this.sink = sink;
        }

        public List<Frame> feed(byte[] data, int length) {
            List<Frame> out = new ArrayList<>(2);
            int at = 0;
            while (at < length) {
                if (header == null) {
                    int n = Math.min(PREFIX_SIZE - prefixFilled, length - at);
                    System.arraycopy(data, at, prefix, prefixFilled, n);
                    prefixFilled += n;
                    at += n;
                    if (prefixFilled < PREFIX_SIZE) {
                        break;
                    }
                    begin();
                }
                at += fill(data, at, length - at);
                Frame done = completed();
                if (done != null) {
                    out.add(done);
                }
            }
            return out;
        }

        /**
         * Where the frame being received wants its next payload bytes, when at least {@code atLeast} of them are still
         * due: the caller reads the socket straight into it (no copy through a read buffer), then calls
         * {@link #filled}. Null when no payload is being received or less than that is due.
         */
        public ByteBuffer payloadTarget(int atLeast) {
            if (header == null || payload == null) {
                return null;
            }
            int from = filled - header.length;
            int due = payloadLength - from;
            if (due < atLeast) {
                return null;
            }
            return landing != null ? landed.slice(from, due) : ByteBuffer.wrap(payload, from, due);
        }

        /** {@code n} bytes were read into {@link #payloadTarget}; the frame they complete, or null. */
        public Frame filled(int n) {
            filled += n;
            return completed();
        }

        /** Let go of the memory of a frame half received (its connection is closing). */
        public void release() {
            if (landing != null) {
                landing.close();
                landing = null;
            }
        }

        private void begin() {
            ByteBuffer p = ByteBuffer.wrap(prefix);
            long frameLength = Integer.toUnsignedLong(p.getInt(0));
            int magic = p.getInt(4);
            if (magic != MAGIC) {
                throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                        String.format("bad magic 0x%08x: not a sparkflow-exchange peer", magic));
            }
            if (p.get(8) != VERSION) {
                throw ErrorCodes.error(ErrorCodes.PROTOCOL, "unsupported protocol version " + p.get(8)
                        + " (this side speaks " + VERSION + ")");
            }
            if (frameLength > maxFrame || frameLength < PREFIX_SIZE - 4) {
                throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                        "frame of " + frameLength + " bytes is outside 10.." + maxFrame);
            }
            long headerLength = Integer.toUnsignedLong(p.getInt(10));
            if (headerLength > frameLength - (PREFIX_SIZE - 4)) {
                throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                        "header length " + headerLength + " exceeds frame length " + frameLength);
            }
            type = p.get(9) & 0xff;
            header = new byte[(int) headerLength];
            payloadLength = (int) (frameLength - (PREFIX_SIZE - 4) - headerLength);
            payload = null;
            filled = 0;
            if (header.length == 0) {
                place();
            }
        }

        /** The header is in: where the payload goes. */
        private void place() {
            landing = sink == null || payloadLength == 0 ? null : sink.land(type, header, payloadLength);
            if (landing != null) {
                landed = landing.bytes();
                payload = EMPTY;
            } else {
                payload = new byte[payloadLength];
            }
        }

        /** Copy up to {@code n} bytes at {@code at} into the frame being received; how many it took. */
        private int fill(byte[] data, int at, int n) {
            int taken = 0;
            if (filled < header.length) {
                int k = Math.min(header.length - filled, n);
                System.arraycopy(data, at, header, filled, k);
                filled += k;
                taken += k;
                if (filled == header.length) {
                    place();
                }
            }
            if (payload != null && taken < n) {
                int from = filled - header.length;
                int k = Math.min(payloadLength - from, n - taken);
                if (landing != null) {
                    landed.put(from, data, at + taken, k);
                } else {
                    System.arraycopy(data, at + taken, payload, from, k);
                }
                filled += k;
                taken += k;
            }
            return taken;
        }

        private Frame completed() {
            if (header == null || payload == null || filled < header.length + payloadLength) {
                return null;
            }
            Frame done = new Frame(type, header, payload, landing);
            header = null;
            payload = null;
            landing = null;
            landed = null;
            prefixFilled = 0;
            return done;
        }
    }
}
