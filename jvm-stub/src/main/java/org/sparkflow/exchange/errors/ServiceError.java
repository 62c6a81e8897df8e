package org.sparkflow.exchange.errors;

/** The exchange service refused a request, or could not be talked to; a subclass names the meaning. */
public class ServiceError extends ExchangeError {
    public ServiceError(String message) {
        super(message);
    }

    public ServiceError(String message, String code) {
        super(message, code);
    }

    public ServiceError(String message, String code, Throwable cause) {
        super(message, code, cause);
    }
}
