package org.sparkflow.exchange.wire;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.util.ArrayDeque;
import java.util.Map;
import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;

/**
 * A blocking, authenticated connection to a coordinator or exchange service: request/response calls
 * ({@code rpc.py}'s table), or a reader's partition request and its buffers ({@link #send}, {@link #receive}).
 * {@code unix:/path} or {@code host:port}. It only moves bytes; {@link Frames} and {@link Handshake} hold the
 * protocol. Not thread safe: one caller at a time.
 */
public final class RpcConnection implements AutoCloseable {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final int MAX_FRAME = 64 << 20;
    private final String address;
    private final SocketChannel channel;
    private final Frames.Decoder decoder = new Frames.Decoder(MAX_FRAME);
    private final ArrayDeque<Frames.Frame> inbox = new ArrayDeque<>();
    private final byte[] readBuffer = new byte[64 << 10];
    private final int timeoutMillis;
    private Selector selector;
    private long nextCall = 1;

    public RpcConnection(String address, String secret, String hostId, int timeoutMillis) {
        this.address = address;
        this.timeoutMillis = timeoutMillis;
        this.channel = open(address);
        try {
            channel.configureBlocking(false);
            selector = Selector.open();
            Handshake handshake = new Handshake(secret, hostId, address);
            while (!handshake.open()) {
                byte[] reply = handshake.step(next());
                if (reply != null) {
                    write(reply);
                }
            }
        } catch (IOException | RuntimeException e) {
            close();
            throw e instanceof ServiceError w ? w : ErrorCodes.error(ErrorCodes.UNREACHABLE,
                    "cannot talk to the exchange service at " + address + ": " + e.getMessage());
        }
    }

    private static SocketChannel open(String address) {
        try {
            if (address.startsWith("unix:")) {
                String path = address.substring(5).replaceFirst("^/+", "/");
                SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
                ch.connect(UnixDomainSocketAddress.of(path));
                return ch;
            }
            String text = address.startsWith("tcp://") ? address.substring(6) : address;
            int colon = text.lastIndexOf(':');
            if (colon < 0) {
                throw ErrorCodes.error(ErrorCodes.BAD_REQUEST,
                        "not a service address: " + address + " (use host:port or unix:/path)");
            }
            String host = text.substring(0, colon).replace("[", "").replace("]", "");
            int port = Integer.parseInt(text.substring(colon + 1));
            SocketChannel ch = SocketChannel.open(new InetSocketAddress(host.isEmpty() ? "127.0.0.1" : host, port));
            ch.socket().setTcpNoDelay(true);
            return ch;
        } catch (IOException | NumberFormatException e) {
            throw ErrorCodes.error(ErrorCodes.UNREACHABLE,
                    "cannot reach the exchange service at " + address + ": " + e);
        }
    }

    /** Call {@code method} with {@code args}; its result, or the {@link ServiceError} of the service's code. */
    public JsonNode call(String method, Map<String, Object> args) {
        long id = nextCall++;
        ObjectNode request = MAPPER.createObjectNode();
        request.put("call_id", id);
        request.put("method", method);
        request.set("args", MAPPER.valueToTree(args));
        try {
            write(Frames.encode(Frames.RPC_REQUEST, request.toString()));
            while (true) {
                Frames.Frame frame = next();
                JsonNode header = Handshake.parse(frame);
                if (frame.type() == Frames.RPC_RESPONSE && header.path("call_id").asLong() == id) {
                    JsonNode error = header.get("error");
                    if (error != null && !error.isNull() && !error.asText().isEmpty()) {
                        throw ErrorCodes.error(header.path("code").asText(ErrorCodes.ERROR), error.asText());
                    }
                    return header.get("result");
                }
                if (frame.type() == Frames.ERROR_RESPONSE && header.path("fatal").asBoolean()) {
                    throw ErrorCodes.error(header.path("code").asText(ErrorCodes.ERROR),
                            "exchange coordinator at " + address + ": "
                            + header.path("message").asText());
                }
                // notifications and anything else not asked for: not this caller's
            }
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCodes.CONNECTION_LOST,
                    method + " on the exchange coordinator at " + address + " failed: " + e);
        }
    }

    /** Send one frame as its pieces, in order (a prefix and header, then a payload: no copy joins them). */
    public void send(byte[]... pieces) {
        try {
            for (byte[] piece : pieces) {
                write(piece);
            }
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCodes.CONNECTION_LOST,
                    "connection to the exchange service at " + address + " failed while sending: " + e);
        }
    }

    /** A frame that has arrived already, or null: never waits (a writer with credit looks for news). */
    public Frames.Frame poll() {
        try {
            if (inbox.isEmpty()) {
                int n = channel.read(ByteBuffer.wrap(readBuffer));
                if (n < 0) {
                    throw ErrorCodes.error(ErrorCodes.CONNECTION_LOST,
                            "the exchange service at " + address + " closed the connection");
                }
                if (n > 0) {
                    inbox.addAll(decoder.feed(readBuffer, n));
                }
            }
            return inbox.poll();
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCodes.CONNECTION_LOST,
                    "connection to the exchange service at " + address + " failed: " + e);
        }
    }

    /** The next frame, waiting up to the connection's timeout. */
    public Frames.Frame receive() {
        try {
            return next();
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCodes.CONNECTION_LOST,
                    "connection to the exchange service at " + address + " failed: " + e);
        }
    }

    public String address() {
        return address;
    }

    private Frames.Frame next() throws IOException {
        while (inbox.isEmpty()) {
            int n = readSome();
            if (n < 0) {
                throw ErrorCodes.error(ErrorCodes.CONNECTION_LOST,
                        "the exchange service at " + address + " closed the connection");
            }
            inbox.addAll(decoder.feed(readBuffer, n));
        }
        return inbox.poll();
    }

    private int readSome() throws IOException {
        ByteBuffer in = ByteBuffer.wrap(readBuffer);
        int n = channel.read(in);
        while (n == 0) {
            await(SelectionKey.OP_READ, "an answer");
            n = channel.read(in);
        }
        return n;
    }

    private void write(byte[] bytes) throws IOException {
        ByteBuffer out = ByteBuffer.wrap(bytes);
        while (out.hasRemaining()) {
            if (channel.write(out) == 0) {
                await(SelectionKey.OP_WRITE, "room to send");
            }
        }
    }

    private void await(int op, String what) throws IOException {
        SelectionKey key = channel.register(selector, op);
        try {
            if (selector.select(timeoutMillis) == 0) {
                throw ErrorCodes.error(ErrorCodes.TIMEOUT,
                        "the exchange service at " + address + " gave no " + what + " within "
                        + timeoutMillis / 1000.0 + " s");
            }
            selector.selectedKeys().clear();
        } finally {
            key.cancel();
            selector.selectNow();
        }
    }

    @Override
    public void close() {
        try {
            if (selector != null) {
                selector.close();
            }
            channel.close();
        } catch (IOException ignored) {
            // closing: nothing left to do with it
        }
    }
}
