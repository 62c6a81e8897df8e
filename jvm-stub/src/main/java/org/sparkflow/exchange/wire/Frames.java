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
