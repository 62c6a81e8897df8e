package org.sparkflow.exchange.wire;

import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.errors.ErrorCodes;
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
import java.security.cert.CertificateException;
import java.util.ArrayDeque;
import java.util.Map;
import java.util.function.Consumer;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLEngineResult;
import javax.net.ssl.SSLException;
import org.sparkflow.exchange.contract.Contract.ErrorCode;

/**
 * A blocking, authenticated connection to a coordinator or exchange service: request/response calls
 * ({@code rpc.py}'s table), or a reader's partition request and its buffers ({@link #send}, {@link #receive}).
 * {@code unix:/path} or {@code host:port}; over TCP with TLS when {@link Tls} settings are given (never on a Unix
 * socket), the handshake then running over the TLS stream. It only moves bytes; {@link Frames} and {@link Handshake}
 * hold the protocol. Not thread safe: one caller at a time.
 */
public final class RpcConnection implements AutoCloseable {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final int MAX_FRAME = Contract.Frame.MAX_FRAME;
    private final String address;
    private final SocketChannel channel;
    private final Frames.Decoder decoder = new Frames.Decoder(MAX_FRAME);
    private final ArrayDeque<Frames.Frame> inbox = new ArrayDeque<>();
    private final byte[] readBuffer = new byte[64 << 10];
    private final int timeoutMillis;
    private Selector selector;
    private long nextCall = 1;
    // TLS (null engine: plaintext): records read but not yet decrypted (fill mode), records to send (drain mode),
    // plaintext decrypted but not yet taken (drain mode)
    private SSLEngine engine;
    private ByteBuffer netIn;
    private ByteBuffer netOut;
    private ByteBuffer appIn;

    public RpcConnection(String address, String secret, String hostId, int timeoutMillis) {
        this(address, secret, hostId, timeoutMillis, null);
    }

    /** {@code tls}: the client's TLS settings (null: plaintext), used on TCP only. */
    public RpcConnection(String address, String secret, String hostId, int timeoutMillis, Tls tls) {
        this.address = address;
        this.timeoutMillis = timeoutMillis;
        this.channel = open(address);
        try {
            channel.configureBlocking(false);
            selector = Selector.open();
            if (tls != null && !address.startsWith("unix:")) {
                String[] hostPort = hostPort(address);
                startTls(tls, hostPort[0], Integer.parseInt(hostPort[1]));
            }
            Handshake handshake = new Handshake(secret, hostId, address);
            try {
                while (!handshake.open()) {
                    byte[] reply = handshake.step(next());
                    if (reply != null) {
                        write(reply);
                    }
                }
            } catch (ServiceError cut) {
                if (engine != null || address.startsWith("unix:") || !ErrorCode.CONNECTION_LOST.equals(cut.code())) {
                    throw cut;
                }
                // a TLS port says nothing to a plaintext client, and closes on it after its helloTimeout
                throw ErrorCodes.error(cut.code(), cut.getMessage() + " before the handshake finished (is it a TLS port? then "
                        + "set tls.caFile)");
            }
        } catch (IllegalArgumentException e) { // a TLS file that cannot serve: the setting's own error
            close();
            throw e;
        } catch (IOException | RuntimeException e) {
            close();
            throw e instanceof ServiceError w ? w : ErrorCodes.error(ErrorCode.UNREACHABLE, "cannot talk to the exchange service at " + address + ": " + e.getMessage());
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
            String[] hostPort = hostPort(address);
            SocketChannel ch = SocketChannel.open(new InetSocketAddress(hostPort[0], Integer.parseInt(hostPort[1])));
            ch.socket().setTcpNoDelay(true);
            return ch;
        } catch (IOException | NumberFormatException e) {
            throw ErrorCodes.error(ErrorCode.UNREACHABLE, "cannot reach the exchange service at " + address + ": " + e);
        }
    }

    /** The host (an empty one: 127.0.0.1) and port of a TCP address. */
    private static String[] hostPort(String address) {
        String text = address.startsWith("tcp://") ? address.substring(6) : address;
        int colon = text.lastIndexOf(':');
        if (colon < 0) {
            throw ErrorCodes.error(ErrorCodes.ERROR, "not a service address: " + address + " (use host:port or unix:/path)");
        }
        String host = text.substring(0, colon).replace("[", "").replace("]", "");
        return new String[] {host.isEmpty() ? "127.0.0.1" : host, text.substring(colon + 1)};
    }

    /**
     * The TLS handshake, within the connection's timeout; a certificate that does not name the address dialled or
     * that the trusted CA did not sign fails it with code {@code tls} and the Python client's words.
     */
    private void startTls(Tls tls, String host, int port) throws IOException {
        engine = tls.engine(host, port);
        int packet = engine.getSession().getPacketBufferSize();
        netIn = ByteBuffer.allocate(packet);
        netOut = ByteBuffer.allocate(packet).flip();
        appIn = ByteBuffer.allocate(engine.getSession().getApplicationBufferSize()).flip();
        try {
            engine.beginHandshake();
            SSLEngineResult.HandshakeStatus status = engine.getHandshakeStatus();
            while (status != SSLEngineResult.HandshakeStatus.FINISHED
                    && status != SSLEngineResult.HandshakeStatus.NOT_HANDSHAKING) {
                switch (status) {
                    case NEED_TASK -> runTasks();
                    case NEED_WRAP -> {
                        wrap(ByteBuffer.allocate(0));
                        while (!flushNet()) {
                            await(SelectionKey.OP_WRITE, "room to send the TLS handshake");
                        }
                    }
                    default -> { // NEED_UNWRAP(_AGAIN)
                        SSLEngineResult r = unwrap();
                        if (r.getStatus() == SSLEngineResult.Status.BUFFER_UNDERFLOW) {
                            int n = channel.read(netIn);
                            if (n < 0) {
                                throw ErrorCodes.error(ErrorCode.TOO_MANY_CONNECTIONS, "the exchange service at " + address + " closed the "
                                        + "connection during the TLS handshake: it had no room for another handshake, "
                                        + "or the handshake took longer than its helloTimeout");
                            }
                            if (n == 0) {
                                await(SelectionKey.OP_READ, "TLS ServerHello (is it a TLS port?)");
                            }
                        } else if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
                            throw ErrorCodes.error(ErrorCode.TOO_MANY_CONNECTIONS, "the exchange service at " + address + " closed the TLS "
                                    + "handshake");
                        }
                    }
                }
                status = engine.getHandshakeStatus();
            }
        } catch (SSLException e) {
            throw verification(tls, host, e);
        }
    }

    /** The handshake's failure in the Python client's words: which check failed, and what to do about it. */
    private ServiceError verification(Tls tls, String host, SSLException e) {
        CertificateException cert = null;
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof CertificateException c) {
                cert = c;
            }
        }
        if (cert == null) {
            return ErrorCodes.error(ErrorCode.TLS, "the exchange service at " + address + " failed the TLS handshake: "
                    + e.getMessage() + " (is it a TLS port, with TLS 1.2 or later?)");
        }
        String message = String.valueOf(cert.getMessage());
        String why = message.contains("subject alternative") || message.contains("No name matching")
                ? "certificate is not valid for '" + host + "' (" + message + ")"
                : message.contains("PKIX") || message.contains("certification path")
                ? "certificate signed by an unknown CA: not one " + tls.trustSetting() + " " + tls.trustFile()
                        + " trusts (unable to get local issuer certificate)"
                : message;
        return ErrorCodes.error(ErrorCode.TLS, "the exchange service at " + address + " failed TLS verification: " + why
                + " (a certificate must name the address clients dial in its subjectAltName, or set "
                + "tls.checkHostname=false to trust the CA alone)");
    }

    private void runTasks() {
        Runnable task;
        while ((task = engine.getDelegatedTask()) != null) {
            task.run();
        }
    }

    /** Encrypt from {@code src} into the empty {@link #netOut}; what it consumed. */
    private int wrap(ByteBuffer src) throws IOException {
        netOut.clear();
        SSLEngineResult r;
        try {
            r = engine.wrap(src, netOut);
        } finally {
            netOut.flip();
        }
        if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
            throw new SSLException("the TLS session is closed");
        }
        return r.bytesConsumed();
    }

    /** Decrypt what {@link #netIn} holds into {@link #appIn}, growing it when a record does not fit. */
    private SSLEngineResult unwrap() throws IOException {
        while (true) {
            appIn.compact();
            netIn.flip();
            SSLEngineResult r;
            try {
                r = engine.unwrap(netIn, appIn);
            } finally {
                netIn.compact();
                appIn.flip();
            }
            switch (r.getStatus()) {
                case BUFFER_OVERFLOW -> {
                    ByteBuffer bigger = ByteBuffer.allocate(appIn.remaining()
                            + engine.getSession().getApplicationBufferSize());
                    bigger.put(appIn).flip();
                    appIn = bigger;
                }
                case BUFFER_UNDERFLOW -> {
                    if (netIn.remaining() == 0) { // a record larger than the buffer
                        ByteBuffer bigger = ByteBuffer.allocate(netIn.capacity()
                                + engine.getSession().getPacketBufferSize());
                        netIn.flip();
                        bigger.put(netIn);
                        netIn = bigger;
                        continue;
                    }
                    return r;
                }
                default -> {
                    return r;
                }
            }
        }
    }

    /** Send what {@link #netOut} holds; false when the socket has no room for all of it now. */
    private boolean flushNet() throws IOException {
        while (netOut.hasRemaining()) {
            if (channel.write(netOut) == 0) {
                return false;
            }
        }
        return true;
    }

    /** Like {@link SocketChannel#read}, decrypting under TLS: 0 when nothing has arrived, -1 at the end. */
    private int readRaw(ByteBuffer dst) throws IOException {
        if (engine == null) {
            return channel.read(dst);
        }
        while (true) {
            if (appIn.hasRemaining()) {
                int n = Math.min(appIn.remaining(), dst.remaining());
                ByteBuffer slice = appIn.slice(appIn.position(), n);
                dst.put(slice);
                appIn.position(appIn.position() + n);
                return n;
            }
            SSLEngineResult r = unwrap();
            if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
                return -1;
            }
            if (engine.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_TASK) {
                runTasks();
            }
            if (engine.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_WRAP) { // a post-handshake answer
                wrap(ByteBuffer.allocate(0));
                while (!flushNet()) {
                    await(SelectionKey.OP_WRITE, "room to send");
                }
            }
            if (r.getStatus() == SSLEngineResult.Status.BUFFER_UNDERFLOW) {
                int n = channel.read(netIn);
                if (n <= 0) {
                    return n;
                }
            }
        }
    }

    /** Like {@link SocketChannel#write}, encrypting under TLS: what it took of {@code src} (0: no room now). */
    private int writeRaw(ByteBuffer src) throws IOException {
        if (engine == null) {
            return channel.write(src);
        }
        if (!flushNet()) {
            return 0;
        }
        int taken = wrap(src);
        flushNet();
        return taken;
    }

    /** Call {@code method} with {@code args}; its result, or a {@link ServiceError} with the service's message and code. */
    public JsonNode call(String method, Map<String, Object> args) {
        return response(request(method, args), method, frame -> { }, timeoutMillis);
    }

    /**
     * Send the request of {@code method} without waiting for its answer (read later with {@link #response}), so a
     * caller can send what does not depend on it before the round trip; its call id.
     */
    public long request(String method, Map<String, Object> args) {
        long id = nextCall++;
        ObjectNode request = MAPPER.createObjectNode();
        request.put("call_id", id);
        request.put("method", method);
        request.set("args", MAPPER.valueToTree(args));
        try {
            write(Frames.encode(Frames.RPC_REQUEST, request.toString()));
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, method + " on the exchange coordinator at " + address + " failed: " + e);
        }
        return id;
    }

    /**
     * The answer to request {@code id} (of {@code method}), waiting up to {@code waitMillis} for each frame; every
     * other frame that arrives meanwhile goes to {@code others} in order (a producer's credit and partition news on
     * its own connection), except a fatal error, which fails the call.
     */
    public JsonNode response(long id, String method, Consumer<Frames.Frame> others, int waitMillis) {
        try {
            while (true) {
                Frames.Frame frame = next(waitMillis);
                if (frame.type() != Frames.RPC_RESPONSE && frame.type() != Frames.ERROR_RESPONSE) {
                    others.accept(frame); // notifications, a producer's credit: not this call's (nor all JSON)
                    continue;
                }
                JsonNode header = Handshake.parse(frame);
                if (frame.type() == Frames.RPC_RESPONSE && header.path("call_id").asLong() == id) {
                    JsonNode error = header.get("error");
                    if (error != null && !error.isNull() && !error.asText().isEmpty()) {
                        throw ErrorCodes.error(header.path("code").asText(ErrorCode.ERROR), error.asText());
                    }
                    return header.get("result");
                }
                if (frame.type() == Frames.ERROR_RESPONSE && header.path("fatal").asBoolean()) {
                    throw ErrorCodes.error(header.path("code").asText(ErrorCode.ERROR), "exchange coordinator at " + address + ": "
                            + header.path("message").asText());
                }
                others.accept(frame); // another call's answer, an error that is not fatal: not this call's
            }
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, method + " on the exchange coordinator at " + address + " failed: " + e);
        }
    }

    /** Send one frame as its pieces, in order (a prefix and header, then a payload: no copy joins them). */
    public void send(byte[]... pieces) {
        try {
            for (byte[] piece : pieces) {
                write(piece);
            }
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, "connection to the exchange service at " + address + " failed while sending: " + e);
        }
    }

    /** A frame that has arrived already, or null: never waits (a writer with credit looks for news). */
    public Frames.Frame poll() {
        try {
            if (inbox.isEmpty()) {
                int n = readRaw(ByteBuffer.wrap(readBuffer));
                if (n < 0) {
                    throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, "the exchange service at " + address + " closed the connection");
                }
                if (n > 0) {
                    inbox.addAll(decoder.feed(readBuffer, n));
                }
            }
            return inbox.poll();
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, "connection to the exchange service at " + address + " failed: " + e);
        }
    }

    /** The next frame, waiting up to the connection's timeout. */
    public Frames.Frame receive() {
        try {
            return next();
        } catch (IOException e) {
            throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, "connection to the exchange service at " + address + " failed: " + e);
        }
    }

    public String address() {
        return address;
    }

    /**
     * Payloads received from now on land where {@code sink} says (a reader's Arrow memory) instead of new byte
     * arrays; frames already received keep theirs. The connection closes what landed and was never taken.
     */
    public void payloadSink(Frames.PayloadSink sink) {
        decoder.sink(sink);
    }

    private Frames.Frame next() throws IOException {
        return next(timeoutMillis);
    }

    private Frames.Frame next(int waitMillis) throws IOException {
        while (inbox.isEmpty()) {
            ByteBuffer direct = decoder.payloadTarget(readBuffer.length); // a large payload: read straight into it
            int n = readSome(direct != null ? direct : ByteBuffer.wrap(readBuffer), waitMillis);
            if (n < 0) {
                throw ErrorCodes.error(ErrorCode.CONNECTION_LOST, "the exchange service at " + address + " closed the connection");
            }
            if (direct != null) {
                Frames.Frame done = decoder.filled(n);
                if (done != null) {
                    inbox.add(done);
                }
            } else {
                inbox.addAll(decoder.feed(readBuffer, n));
            }
        }
        return inbox.poll();
    }

    private int readSome(ByteBuffer in, int waitMillis) throws IOException {
        int n = readRaw(in);
        while (n == 0) {
            await(SelectionKey.OP_READ, "an answer", waitMillis);
            n = readRaw(in);
        }
        return n;
    }

    private void write(byte[] bytes) throws IOException {
        ByteBuffer out = ByteBuffer.wrap(bytes);
        while (out.hasRemaining()) {
            if (writeRaw(out) == 0) {
                await(SelectionKey.OP_WRITE, "room to send");
            }
        }
        while (engine != null && !flushNet()) {
            await(SelectionKey.OP_WRITE, "room to send");
        }
    }

    private void await(int op, String what) throws IOException {
        await(op, what, timeoutMillis);
    }

    private void await(int op, String what, int waitMillis) throws IOException {
        SelectionKey key = channel.register(selector, op);
        try {
            if (selector.select(waitMillis) == 0) {
                throw ErrorCodes.error(ErrorCode.TIMEOUT, "the exchange service at " + address + " gave no " + what + " within "
                        + waitMillis / 1000.0 + " s");
            }
            selector.selectedKeys().clear();
        } finally {
            key.cancel();
            selector.selectNow();
        }
    }

    @Override
    public void close() {
        decoder.release();
        for (Frames.Frame f : inbox) {
            if (f.landed() != null) {
                f.landed().close();
            }
        }
        inbox.clear();
        try {
            if (selector != null) {
                selector.close();
            }
            if (engine != null && channel.isOpen()) { // close_notify, if the socket takes it now: never waits
                engine.closeOutbound();
                netOut.clear();
                engine.wrap(ByteBuffer.allocate(0), netOut);
                netOut.flip();
                channel.write(netOut);
            }
        } catch (IOException | RuntimeException ignored) {
            // closing: a failed TLS session or a socket already gone has nothing left to say
        } finally {
            try {
                channel.close();
            } catch (IOException ignored) {
                // closing: nothing left to do with it
            }
        }
    }
}
