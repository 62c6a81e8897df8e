package org.sparkflow.exchange.discovery;

import java.io.Serializable;

/** Where the coordinator is and how to prove ourselves to it; {@code source} says where that was learnt. */
public record Endpoint(String coordinator, String secret, String hostId, String source) implements Serializable {
    @Override
    public String toString() {
        return coordinator + " (from " + source + ")";
    }
}
