package org.sparkflow.exchange.errors;

/** A request the service cannot carry out as asked (a bad argument, a closed write, differing widths...). */
public class InvalidRequest extends ServiceError {
    public InvalidRequest(String message) {
        super(message);
    }

    public InvalidRequest(String message, String code) {
        super(message, code);
    }

    public InvalidRequest(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.BAD_REQUEST;
    }
}
