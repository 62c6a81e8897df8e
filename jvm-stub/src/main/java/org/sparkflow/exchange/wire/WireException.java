package org.sparkflow.exchange.wire;

import org.sparkflow.exchange.wire.Contract.ErrorCode;

/** The coordinator or service cannot be talked to: unreachable, refused us, or sent something invalid. */
public class WireException extends RuntimeException {
    private final String code;

    public WireException(String message) {
        this(message, ErrorCode.ERROR);
    }

    public WireException(String message, String code) {
        super(message);
        this.code = code;
    }

    /** The service's error code ({@code no_exchange}, {@code auth}, ...), "error" when it gave none. */
    public String code() {
        return code;
    }
}
