package org.sparkflow.exchange.errors;

/** The exchange was overwritten or dropped while this write or read was using it. */
public class ExchangeReplaced extends ServiceError {
    public ExchangeReplaced(String message) {
        super(message);
    }

    public ExchangeReplaced(String message, String code) {
        super(message, code);
    }

    public ExchangeReplaced(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.REPLACED;
    }
}
