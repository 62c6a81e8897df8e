package org.sparkflow.exchange.errors;

/** A read's given schema, or an append's schema, differs from the exchange's. */
public class SchemaMismatch extends ServiceError {
    public SchemaMismatch(String message) {
        super(message);
    }

    public SchemaMismatch(String message, String code) {
        super(message, code);
    }

    public SchemaMismatch(String message, String code, Throwable cause) {
        super(message, code, cause);
    }

    @Override
    protected String defaultCode() {
        return ErrorCodes.SCHEMA_MISMATCH;
    }
}
