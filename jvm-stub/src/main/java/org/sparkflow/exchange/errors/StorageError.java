package org.sparkflow.exchange.errors;

/** The service's storage failed the request (a full disk, too many open files...). */
public class StorageError extends ServiceError {
    public StorageError(String message) {
        super(message);
    }

    public StorageError(String message, String code) {
        super(message, code);
    }

    public StorageError(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.STORAGE;
    }
}
