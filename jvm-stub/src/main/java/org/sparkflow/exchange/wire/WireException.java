package org.sparkflow.exchange.wire;

import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;

/**
 * The coordinator or service cannot be talked to, refused us, or sent something invalid: a {@link ServiceError}
 * whose marker names the class of its code's meaning. New code throws {@link ErrorCodes#error} instead, which
 * gives the class of that name (a {@code ServiceUnavailable}, an {@code ExchangeNotFound}...).
 */
public class WireException extends ServiceError {
    public WireException(String message) {
        this(message, ErrorCodes.ERROR);
    }

    public WireException(String message, String code) {
        super(message, code);
    }

    @Override
    public String pythonClass() {
        return ErrorCodes.pythonClass(code());
    }
}
