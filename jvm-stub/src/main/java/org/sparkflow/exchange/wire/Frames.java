package org.sparkflow.exchange.wire;

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
    public static final int MAGIC = 0x53465845; // "SFXE"
    public static final byte VERSION = 2; // protocol.py's VERSION: 2, proofs cover both nonces and the service id
    public static final int PREFIX_SIZE = 14;
    public static final int SERVER_HELLO = 1;
    public static final int HELLO = 2;
    public static final int WELCOME = 3;
    public static final int PARTITION_REQUEST = 10;
    public static final int ADD_CREDIT = 11;
    public static final int CANCEL_PARTITION_REQUEST = 13;
    public static final int BUFFER_RESPONSE = 15;
    public static final int ERROR_RESPONSE = 16;
    public static final int REGISTER_PARTITION = 20;
    public static final int PARTITION_REGISTERED = 21;
    public static final int PUSH_BUFFER = 22;
    public static final int PRODUCER_CREDIT = 23;
    public static final int FINISH_PARTITION = 24;
    public static final int FAIL_PARTITION = 25;
    public static final int PARTITION_FINISHED = 26;
    public static final int RPC_REQUEST = 30;
    public static final int RPC_RESPONSE = 31;
    public static final int NOTIFY = 32;
    public static final int PARTITION_RELEASED = 35;

    private Frames() {}

    /** One received frame: its type, JSON header and payload. */
    public record Frame(int type, byte[] header, byte[] payload) {
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

    /** Incremental decoder: feed bytes as they arrive, take the frames they complete. */
    public static final class Decoder {
        private final int maxFrame;
        private ByteBuffer pending = ByteBuffer.allocate(64 << 10);

        public Decoder(int maxFrame) {
            this.maxFrame = maxFrame;
        }

        public List<Frame> feed(byte[] data, int length) {
            ensure(length);
            pending.put(data, 0, length);
            pending.flip();
            List<Frame> out = new ArrayList<>();
            while (pending.remaining() >= PREFIX_SIZE) {
                int start = pending.position();
                long frameLength = Integer.toUnsignedLong(pending.getInt(start));
                int magic = pending.getInt(start + 4);
                if (magic != MAGIC) {
                    throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                            String.format("bad magic 0x%08x: not a sparkflow-exchange peer", magic));
                }
                if (pending.get(start + 8) != VERSION) {
                    throw ErrorCodes.error(ErrorCodes.PROTOCOL, "unsupported protocol version " + pending.get(start + 8)
                            + " (this side speaks " + VERSION + ")");
                }
                if (frameLength > maxFrame || frameLength < PREFIX_SIZE - 4) {
                    throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                            "frame of " + frameLength + " bytes is outside 10.." + maxFrame);
                }
                long headerLength = Integer.toUnsignedLong(pending.getInt(start + 10));
                if (headerLength > frameLength - (PREFIX_SIZE - 4)) {
                    throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                            "header length " + headerLength + " exceeds frame length " + frameLength);
                }
                if (pending.remaining() < 4 + frameLength) {
                    break;
                }
                int type = pending.get(start + 9) & 0xff;
                byte[] header = new byte[(int) headerLength];
                byte[] payload = new byte[(int) (frameLength - (PREFIX_SIZE - 4) - headerLength)];
                pending.position(start + PREFIX_SIZE);
                pending.get(header).get(payload);
                out.add(new Frame(type, header, payload));
            }
            pending.compact();
            return out;
        }

        private void ensure(int more) {
            if (pending.remaining() < more) {
                ByteBuffer bigger = ByteBuffer.allocate(Math.max(pending.capacity() * 2, pending.position() + more));
                pending.flip();
                bigger.put(pending);
                pending = bigger;
            }
        }
    }
}
