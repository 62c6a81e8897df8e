package org.sparkflow.exchange.coordinator;

import org.sparkflow.exchange.errors.ErrorCodes;
import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.contract.Contract.ExchangeState;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * The few coordinator calls that planning makes (the catalog's listing and loading, a write's declaration), each on a
 * fresh connection (planning is rare, connections cheap).
 */
public final class CoordinatorClient {
    public static final int TIMEOUT_MILLIS = 30_000;
    private final Endpoint endpoint;

    public CoordinatorClient(Endpoint endpoint) {
        this.endpoint = endpoint;
    }

    /** One call on a fresh connection; its result, or the {@code ServiceError} of the coordinator's code. */
    public JsonNode call(String method, Map<String, Object> args) {
        try (RpcConnection conn = new RpcConnection(endpoint.coordinator(), endpoint.secret(), endpoint.hostId(),
                TIMEOUT_MILLIS, endpoint.tls())) {
            return conn.call(method, args);
        }
    }

    /** The batch exchanges' names. */
    public List<String> names() {
        List<String> out = new ArrayList<>();
        for (JsonNode ex : call("list_exchanges", Map.of())) {
            if (!ExchangeState.STREAMING.equals(ex.path("state").asText())) { // streams are read with readStream, not here
                out.add(ex.path("name").asText());
            }
        }
        return out;
    }

    /** The exchange's description; null when it does not exist. */
    public ExchangeDescription describe(String name) {
        try {
            return ExchangeDescription.parse(call("get_exchange", Map.of("name", name)));
        } catch (ServiceError e) {
            if (ErrorCodes.NO_EXCHANGE.equals(e.code())) {
                return null;
            }
            throw e;
        }
    }

    /**
     * The exchange's description once it is sealed or aborted, the coordinator waiting up to {@code waitMillis}
     * for that (woken by the commit: no polling); as it is after the wait; null when it does not exist.
     */
    public ExchangeDescription describeWhenSealed(String name, long waitMillis) {
        try {
            return ExchangeDescription.parse(call("get_exchange", Map.of("name", name, "wait",
                    Math.max(0, waitMillis) / 1000.0, "until_sealed", true)));
        } catch (ServiceError e) {
            if (ErrorCodes.NO_EXCHANGE.equals(e.code())) {
                return null;
            }
            throw e;
        }
    }

    /**
     * The exchange's description; null when it does not exist, or was lost with the service that held it (it holds
     * nothing: a write may declare it anew).
     */
    public ExchangeDescription describeForWrite(String name) {
        try {
            return describe(name);
        } catch (ServiceError e) {
            if (ErrorCodes.EXCHANGE_LOST.equals(e.code())) {
                return null;
            }
            throw e;
        }
    }

    /** Drop the exchange; false when it did not exist. */
    public boolean drop(String name) {
        try {
            call("drop", Map.of("name", name));
            return true;
        } catch (ServiceError e) {
            if (ErrorCodes.NO_EXCHANGE.equals(e.code())) {
                return false;
            }
            throw e;
        }
    }
}
