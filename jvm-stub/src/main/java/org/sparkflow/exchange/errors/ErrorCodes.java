package org.sparkflow.exchange.errors;

import java.util.Map;

/**
 * The error codes the service sends with every refusal (the values of Python's {@code ErrorCode}), and the one
 * table from a code to the class of its meaning (Python's {@code errors._CLASS_OF}): the only Java place either
 * is written. tests/test_error_vocabulary.py checks both against sparkflow_exchange/errors.py.
 */
public final class ErrorCodes {
    public static final String ERROR = "error";
    public static final String INTERNAL = "internal";
    public static final String BAD_REQUEST = "bad_request";
    public static final String NOT_COORDINATOR = "not_coordinator";
    public static final String WRITE_CLOSED = "closed";
    public static final String WIDTH_MISMATCH = "width_mismatch";
    public static final String FORWARD_PARALLELISM = "forward_parallelism";
    public static final String NOT_A_BATCH = "not_a_batch";
    public static final String NOT_A_STREAM = "not_a_stream";
    public static final String SCHEMA_MISMATCH = "schema_mismatch";
    public static final String LAYOUT_MISMATCH = "layout_mismatch";
    public static final String SUPERSEDED = "superseded";
    public static final String NO_SUBPARTITIONS = "no_subpartitions";
    public static final String UNREGISTERED_SERVICE = "unregistered_service";
    public static final String NO_EXCHANGE = "no_exchange";
    public static final String REPLACED = "replaced";
    public static final String EXCHANGE_LOST = "exchange_lost";
    public static final String ROWS_LOST = "rows_lost";
    public static final String UNREACHABLE = "unreachable";
    public static final String NO_SERVICE = "no_service";
    public static final String CONNECTION_LOST = "lost";
    public static final String TIMEOUT = "timeout";
    public static final String TOO_MANY_CONNECTIONS = "too_many_connections";
    public static final String AUTH = "auth";
    public static final String FORBIDDEN = "forbidden";
    public static final String LIMIT = "limit";
    public static final String TLS = "tls";
    public static final String PROTOCOL = "protocol";
    public static final String STORAGE = "storage";
    public static final String OUT_OF_MEMORY = "out_of_memory";
    public static final String UNKNOWN_PARTITION = "unknown_partition";
    public static final String PRODUCER_FAILED = "producer_failed";
    public static final String RELEASED = "released";
    public static final String READ_FAILED = "read_failed";
    public static final String REGISTER_FAILED = "register_failed";
    public static final String PUSH_FAILED = "push_failed";
    public static final String FAILED = "failed";

    /** code -> the class of its meaning; a code not listed is a plain {@link ServiceError}. */
    static final Map<String, String> CLASS_OF = Map.ofEntries(
            Map.entry(BAD_REQUEST, "InvalidRequest"),
            Map.entry(NOT_COORDINATOR, "InvalidRequest"),
            Map.entry(WRITE_CLOSED, "InvalidRequest"),
            Map.entry(WIDTH_MISMATCH, "InvalidRequest"),
            Map.entry(LAYOUT_MISMATCH, "InvalidRequest"),
            Map.entry(FORWARD_PARALLELISM, "InvalidRequest"),
            Map.entry(NOT_A_BATCH, "InvalidRequest"),
            Map.entry(NOT_A_STREAM, "InvalidRequest"),
            Map.entry(UNREGISTERED_SERVICE, "InvalidRequest"),
            Map.entry(SCHEMA_MISMATCH, "SchemaMismatch"),
            Map.entry(NO_EXCHANGE, "ExchangeNotFound"),
            Map.entry(EXCHANGE_LOST, "ExchangeLost"),
            Map.entry(REPLACED, "ExchangeReplaced"),
            Map.entry(RELEASED, "PartitionReleasedError"),
            Map.entry(ROWS_LOST, "DataLost"),
            Map.entry(UNREACHABLE, "ServiceUnavailable"),
            Map.entry(NO_SERVICE, "ServiceUnavailable"),
            Map.entry(CONNECTION_LOST, "ServiceUnavailable"),
            Map.entry(TIMEOUT, "ServiceUnavailable"),
            Map.entry(TOO_MANY_CONNECTIONS, "ServiceUnavailable"),
            Map.entry(AUTH, "AuthenticationFailed"),
            Map.entry(TLS, "AuthenticationFailed"),
            Map.entry(FORBIDDEN, "NotPermitted"),
            Map.entry(LIMIT, "LimitReached"),
            Map.entry(STORAGE, "StorageError"),
            Map.entry(OUT_OF_MEMORY, "ServiceUnavailable"));

    private ErrorCodes() {}

    /** The Python class name of a code's meaning ({@code ServiceError} for a code without a class of its own). */
    public static String pythonClass(String code) {
        return CLASS_OF.getOrDefault(code, "ServiceError");
    }

    /** The failure of a code's meaning, as the Python client's {@code error_for} makes it. */
    public static ServiceError error(String code, String message) {
        return error(code, message, null);
    }

    /** {@link #error(String, String)} with a cause. */
    public static ServiceError error(String code, String message, Throwable cause) {
        String c = code == null || code.isEmpty() ? ERROR : code;
        return switch (pythonClass(c)) {
            case "InvalidRequest" -> new InvalidRequest(message, c, cause);
            case "SchemaMismatch" -> new SchemaMismatch(message, c, cause);
            case "ExchangeNotFound" -> new ExchangeNotFound(message, c, cause);
            case "ExchangeLost" -> new ExchangeLost(message, c, cause);
            case "ExchangeReplaced" -> new ExchangeReplaced(message, c, cause);
            case "PartitionReleasedError" -> new PartitionReleasedError(message, c, cause);
            case "DataLost" -> new DataLost(message, c, cause);
            case "ServiceUnavailable" -> new ServiceUnavailable(message, c, cause);
            case "AuthenticationFailed" -> new AuthenticationFailed(message, c, cause);
            case "NotPermitted" -> new NotPermitted(message, c, cause);
            case "LimitReached" -> new LimitReached(message, c, cause);
            case "StorageError" -> new StorageError(message, c, cause);
            default -> new ServiceError(message, c, cause);
        };
    }
}
