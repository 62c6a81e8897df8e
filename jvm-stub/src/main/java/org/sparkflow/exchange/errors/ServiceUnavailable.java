package org.sparkflow.exchange.errors;

/** The service cannot be reached, went away (killed, crashed, stopped) or did not answer in time. */
public class ServiceUnavailable extends ServiceError {
    public ServiceUnavailable(String message) {
        super(message);
    }

    public ServiceUnavailable(String message, String code) {
        super(message, code);
    }

    public ServiceUnavailable(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.CONNECTION_LOST;
    }
}
