package org.sparkflow.exchange.errors;

import java.util.Map;
import org.sparkflow.exchange.contract.Contract;

/**
 * The error codes the service sends with every refusal, and the table from a code to the class of its meaning. Both
 * are generated from {@code sparkflow_exchange/contract.json} ({@code error_codes}, {@code error_classes}), which
 * Python's {@code ErrorCode} and {@code errors._CLASS_OF} are made from too: a code and its class are written once.
 * The codes ({@code ErrorCodes.NO_EXCHANGE}...) are inherited from {@link Contract.ErrorCode}.
 */
public final class ErrorCodes extends Contract.ErrorCode {
    /** code -> the class of its meaning; a code not listed is a plain {@link ServiceError}. */
    static final Map<String, String> CLASS_OF = Contract.ErrorClass.OF;

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
