package org.sparkflow.exchange.read;

/** A read cannot return the exchange's rows exactly (corrupt, lost or unreachable data); nothing wrong was returned. */
public class ExchangeReadException extends RuntimeException {
    public ExchangeReadException(String message) {
        super(message);
    }

    public ExchangeReadException(String message, Throwable cause) {
        super(message, cause);
    }
}
