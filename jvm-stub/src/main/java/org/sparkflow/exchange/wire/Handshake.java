package org.sparkflow.exchange.wire;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.HexFormat;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.sparkflow.exchange.errors.ErrorCodes;

/**
 * The client's side of the mutual HMAC handshake, sans-IO ({@code network/auth.py}, {@code connection.py}):
 * answer the ServerHello with a nonce of our own and HMAC-SHA256(secret, "client-to-service:" its nonce ":"
 * our nonce ":" its service id), then require the Welcome to carry HMAC-SHA256(secret, "service-to-client:"
 * our nonce ":" its nonce ":" its service id): each proof belongs to one connection and one service. Nonces
 * are 32 lowercase hex digits. (The JVM only reads and writes: it never dials a service by its id, so it has
 * no use for {@code connection.py}'s expected service.)
 */
public final class Handshake {
    enum State { GREETING, PROVING, OPEN }

    private static final ObjectMapper MAPPER = new ObjectMapper();
    private final String secret;
    private final String hostId;
    private final String where;
    private final String nonce;
    private String serverNonce;
    private String serviceId;
    private State state = State.GREETING;

    public Handshake(String secret, String hostId, String where) {
        this.secret = secret == null || secret.isEmpty() ? null : secret;
        this.hostId = hostId;
        this.where = where;
        byte[] random = new byte[16];
        new SecureRandom().nextBytes(random);
        this.nonce = HexFormat.of().formatHex(random);
    }

    public boolean open() {
        return state == State.OPEN;
    }

    /** Take a frame received before the handshake ended; returns the Hello frame to send, if any. */
    public byte[] step(Frames.Frame frame) {
        JsonNode header = parse(frame);
        if (frame.type() == Frames.ERROR_RESPONSE) {
            throw ErrorCodes.error(header.path("code").asText(ErrorCodes.ERROR),
                    "service at " + where + " refused the connection: " + header.path("message").asText());
        }
        if (state == State.GREETING && frame.type() == Frames.SERVER_HELLO) {
            serverNonce = header.path("nonce").asText();
            serviceId = header.path("service_id").asText("");
            if (secret != null && !validNonce(serverNonce)) {
                throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                        "protocol error: the exchange service at " + where + " sent a nonce that is "
                        + "not 32 lowercase hex digits");
            }
            ObjectNode hello = MAPPER.createObjectNode();
            hello.put("client_id", clientId());
            hello.put("proof", secret == null ? "" : mac("client-to-service:" + serverNonce + ":" + nonce + ":" + serviceId));
            hello.put("host_id", hostId);
            hello.put("nonce", nonce);
            state = State.PROVING;
            return Frames.encode(Frames.HELLO, hello.toString());
        }
        if (state == State.PROVING && frame.type() == Frames.WELCOME) {
            if (secret != null) {
                String proof = header.path("proof").asText("");
                String expected = mac("service-to-client:" + nonce + ":" + serverNonce + ":" + serviceId);
                if (proof.isEmpty() || !MessageDigest.isEqual(expected.getBytes(StandardCharsets.US_ASCII),
                        proof.getBytes(StandardCharsets.US_ASCII))) {
                    throw ErrorCodes.error(ErrorCodes.AUTH,
                            "service at " + where + " is not trusted: it did not prove the shared secret");
                }
            }
            state = State.OPEN;
            return null;
        }
        throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                "protocol error: the exchange service at " + where + " sent message type "
                + frame.type() + " during the handshake (state " + state + ")");
    }

    static boolean validNonce(String nonce) {
        if (nonce.length() != 32) {
            return false;
        }
        for (int i = 0; i < nonce.length(); i++) {
            char c = nonce.charAt(i);
            if (!(c >= '0' && c <= '9' || c >= 'a' && c <= 'f')) {
                return false;
            }
        }
        return true;
    }

    static JsonNode parse(Frames.Frame frame) {
        try {
            return frame.header().length == 0 ? MAPPER.createObjectNode() : MAPPER.readTree(frame.header());
        } catch (java.io.IOException e) {
            throw ErrorCodes.error(ErrorCodes.PROTOCOL,
                    "protocol error: a frame's JSON header is unreadable: " + e.getMessage());
        }
    }

    private String mac(String message) {
        try {
            Mac hmac = Mac.getInstance("HmacSHA256");
            hmac.init(new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
            return HexFormat.of().formatHex(hmac.doFinal(message.getBytes(StandardCharsets.UTF_8)));
        } catch (java.security.GeneralSecurityException e) {
            throw new IllegalStateException("HMAC-SHA256 is not available in this JVM", e);
        }
    }

    private static String clientId() {
        return ManagementFactory.getRuntimeMXBean().getName().replace('@', ':') + ":jvm";
    }
}
