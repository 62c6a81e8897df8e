package org.sparkflow.exchange.read;

import org.sparkflow.exchange.errors.ExchangeReadError;

/**
 * A read cannot return the exchange's rows exactly (corrupt, lost or unreachable data); nothing wrong was returned.
 * An {@link ExchangeReadError}, as the Python reader reports the same failure.
 */
public class ExchangeReadException extends ExchangeReadError {
    public ExchangeReadException(String message) {
        super(message);
    }

    public ExchangeReadException(String message, Throwable cause) {
        super(message, null, cause);
    }

    @Override
    public String pythonClass() {
        return "ExchangeReadError";
    }

    /** The exchange was {@code how} (dropped, overwritten) while the read ran, as the Python reader says it. */
    static String gone(String exchange, String how) {
        return goneHead(exchange) + how + " while this read ran: the read stops rather than return part of the state "
                + "it was planned on; read the exchange again";
    }

    /** How every {@link #gone} message of {@code exchange} begins. */
    static String goneHead(String exchange) {
        return "exchange '" + exchange + "' was ";
    }
}
