package org.sparkflow.exchange.errors;

/** Rows or buffers were lost between a writer and the service; the write is refused, never half kept. */
public class DataLost extends ServiceError {
    public DataLost(String message) {
        super(message);
    }

    public DataLost(String message, String code) {
        super(message, code);
    }

    public DataLost(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.ROWS_LOST;
    }
}
