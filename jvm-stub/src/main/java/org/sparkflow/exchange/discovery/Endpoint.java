package org.sparkflow.exchange.discovery;

import java.io.Serializable;
import org.sparkflow.exchange.wire.Tls;

/**
 * Where the coordinator is and how to prove ourselves to it; {@code source} says where that was learnt; {@code tls}:
 * the client's TLS settings for TCP addresses (null: plaintext).
 */
public record Endpoint(String coordinator, String secret, String hostId, String source, Tls tls)
        implements Serializable {
    @Override
    public String toString() {
        return coordinator + " (from " + source + ")";
    }
}
