package org.sparkflow.exchange.errors;

/** The exchange's data went with a service that ended unexpectedly (killed or crashed). */
public class ExchangeLost extends ServiceError {
    public ExchangeLost(String message) {
        super(message);
    }

    public ExchangeLost(String message, String code) {
        super(message, code);
    }

    public ExchangeLost(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.EXCHANGE_LOST;
    }
}
