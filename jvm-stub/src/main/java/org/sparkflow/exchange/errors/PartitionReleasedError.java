package org.sparkflow.exchange.errors;

/** The service released the partition while it was written (its attempt lost the commit, its write was aborted). */
public class PartitionReleasedError extends ServiceError {
    public PartitionReleasedError(String message) {
        super(message);
    }

    public PartitionReleasedError(String message, String code) {
        super(message, code);
    }

    public PartitionReleasedError(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.RELEASED;
    }
}
