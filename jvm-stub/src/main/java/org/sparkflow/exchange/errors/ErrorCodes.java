package org.sparkflow.exchange.errors;

import java.util.Map;
import org.sparkflow.exchange.contract.Contract;

/**
 * The error codes the service sends with every refusal, and the one table from a code to the class of its meaning
 * (Python's {@code errors._CLASS_OF}). The codes themselves ({@code ErrorCodes.NO_EXCHANGE}...) are inherited from
 * the generated {@link Contract.ErrorCode}, made from {@code sparkflow_exchange/contract.json} as Python's
 * {@code ErrorCode} is checked against it: a code is written once. tests/test_error_vocabulary.py checks the table.
 */
public final class ErrorCodes extends Contract.ErrorCode {
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
            Map.entry(NO_REPLICA_HOST, "InvalidRequest"),
            Map.entry(REPLICA_LOST, "ServiceUnavailable"),
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
