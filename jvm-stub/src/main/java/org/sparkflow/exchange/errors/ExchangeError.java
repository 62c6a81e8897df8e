package org.sparkflow.exchange.errors;

import java.util.regex.Pattern;

/**
 * The base of every failure sparkflow-exchange reports on the JVM path, named as the Python class of the same
 * meaning ({@code sparkflow_exchange.<Name>}) and carrying the service's error code.
 *
 * <p>{@link #getMessage()} begins with a marker, {@code [sparkflow_exchange.<PythonClass> <code>] }, that survives
 * Spark's wrapping of a task failure (a {@code SparkException} whose message quotes the cause) and PySpark's
 * conversion: {@code sparkflow_exchange.errors.from_spark} turns it back into the Python class with the same
 * message. {@link #detail()} is the message without it.
 */
public class ExchangeError extends RuntimeException {
    /** A marker as it appears in a message (one quoted inside another message is dropped: the outer one names it). */
    static final Pattern MARKER = Pattern.compile("\\[sparkflow_exchange\\.\\w+(?: \\w+)?\\] ");

    private final String code;
    private final String detail;

    public ExchangeError(String message) {
        this(message, null, null);
    }

    public ExchangeError(String message, String code) {
        this(message, code, null);
    }

    public ExchangeError(String message, String code, Throwable cause) {
        super(cause);
        this.detail = message == null ? "" : MARKER.matcher(message).replaceAll("");
        this.code = code == null || code.isEmpty() ? defaultCode() : code;
    }

    /** The code a failure of this class has when none was given (the Python class's {@code default_code}). */
    protected String defaultCode() {
        return ErrorCodes.ERROR;
    }

    /** The service's error code ({@code exchange_lost}, {@code no_exchange}, {@code auth}, ...). */
    public String code() {
        return code;
    }

    /** The message without its marker. */
    public String detail() {
        return detail;
    }

    /** The name of the Python class of the same meaning (in the {@code sparkflow_exchange} package). */
    public String pythonClass() {
        return getClass().getSimpleName();
    }

    @Override
    public String getMessage() {
        return "[sparkflow_exchange." + pythonClass() + " " + code + "] " + detail;
    }
}
