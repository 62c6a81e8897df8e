package org.sparkflow.exchange.errors;

/** The read cannot complete; the message says why (lost service, failed or aborted write, corrupt data). */
public class ExchangeReadError extends ExchangeError {
    public ExchangeReadError(String message) {
        super(message);
    }

    public ExchangeReadError(String message, String code) {
        super(message, code);
    }

    public ExchangeReadError(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

}
