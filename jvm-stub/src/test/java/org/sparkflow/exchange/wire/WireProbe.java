package org.sparkflow.exchange.wire;

import org.sparkflow.exchange.contract.Contract;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.lang.reflect.Field;
import java.util.HexFormat;
import org.sparkflow.exchange.errors.ServiceError;

/** {@link Handshake} driven by frames a test made, for {@code UnitDriver}'s {@code handshake} request. */
public final class WireProbe {
    private static final ObjectMapper JSON = new ObjectMapper();

    private WireProbe() {}

    /**
     * {@code {"secret": s | null, "host_id": h, "nonce": the client's nonce (else a random one), "frames": [hex..]}}:
     * the frames fed one at a time; answers {@code sent} (the hex of each step's reply, null for none), {@code open},
     * and the {@code error} and {@code code} of a refusal (the steps after it are not taken).
     */
    public static ObjectNode handshake(JsonNode r) throws ReflectiveOperationException {
        Handshake h = new Handshake(r.path("secret").isTextual() ? r.path("secret").asText() : null,
                r.path("host_id").asText(), "test-peer");
        if (r.has("nonce")) { // a fixed nonce, so both languages prove the same message
            Field nonce = Handshake.class.getDeclaredField("nonce");
            nonce.setAccessible(true);
            nonce.set(h, r.path("nonce").asText());
        }
        ObjectNode out = JSON.createObjectNode();
        ArrayNode sent = out.putArray("sent");
        Frames.Decoder decoder = new Frames.Decoder(Contract.Frame.MAX_FRAME);
        try {
            for (JsonNode hex : r.path("frames")) {
                byte[] data = HexFormat.of().parseHex(hex.asText());
                for (Frames.Frame frame : decoder.feed(data, data.length)) {
                    byte[] reply = h.step(frame);
                    sent.add(reply == null ? null : HexFormat.of().formatHex(reply));
                }
            }
        } catch (ServiceError e) {
            out.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
            out.put("code", e.code());
        }
        out.put("open", h.open());
        return out;
    }
}
