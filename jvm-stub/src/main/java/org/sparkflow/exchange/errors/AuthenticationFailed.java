package org.sparkflow.exchange.errors;

/** Client and service could not prove the shared secret to each other, or TLS verification failed. */
public class AuthenticationFailed extends ServiceError {
    public AuthenticationFailed(String message) {
        super(message);
    }

    public AuthenticationFailed(String message, String code) {
        super(message, code);
    }

    public AuthenticationFailed(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.AUTH;
    }
}
