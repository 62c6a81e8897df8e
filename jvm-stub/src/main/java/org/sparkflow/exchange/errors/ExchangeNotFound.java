package org.sparkflow.exchange.errors;

/** No exchange of that name was declared within declareTimeout. */
public class ExchangeNotFound extends ServiceError {
    public ExchangeNotFound(String message) {
        super(message);
    }

    public ExchangeNotFound(String message, String code) {
        super(message, code);
    }

    public ExchangeNotFound(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.NO_EXCHANGE;
    }
}
