package org.sparkflow.exchange.errors;

/** The credential holds all the service lets one credential hold; the message names the limit. */
public class LimitReached extends ServiceError {
    public LimitReached(String message) {
        super(message);
    }

    public LimitReached(String message, String code) {
        super(message, code);
    }

    public LimitReached(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.LIMIT;
    }
}
