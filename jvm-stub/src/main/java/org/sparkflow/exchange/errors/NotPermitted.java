package org.sparkflow.exchange.errors;

/** The credential this connection authenticated with may not do this. */
public class NotPermitted extends ServiceError {
    public NotPermitted(String message) {
        super(message);
    }

    public NotPermitted(String message, String code) {
        super(message, code);
    }

    public NotPermitted(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.FORBIDDEN;
    }
}
