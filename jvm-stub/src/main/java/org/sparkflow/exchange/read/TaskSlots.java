package org.sparkflow.exchange.read;

import java.util.Locale;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.internal.SQLConf;
import org.sparkflow.exchange.contract.Contract;

/**
 * The reading application's task slots, which a read planned while its exchange is written is laid out to (every
 * read task then runs while the producers write): the read's {@code taskSlots} option, else the session's
 * {@code spark.sparkflow.exchange.taskSlots}, else Spark's default parallelism (1 without a session).
 */
public final class TaskSlots {
    /** The read option (and, with the session prefix, the session setting). */
    public static final String OPTION = Contract.Option.TASK_SLOTS;

    private TaskSlots() {}

    /** The slots: {@code option} (the read's value, or null), else the session's setting, else its parallelism. */
    public static int of(String option) {
        if (option != null) {
            return parse(option, "the read option " + OPTION);
        }
        String session = SQLConf.get().getConfString(Contract.Option.PREFIX + OPTION, "").strip();
        if (!session.isEmpty()) {
            return parse(session, Contract.Option.PREFIX + OPTION);
        }
        return defaultParallelism();
    }

    /** Spark's default parallelism of the active session, at least 1 (1 without a session). */
    static int defaultParallelism() {
        try {
            return Math.max(1, SparkSession.active().sparkContext().defaultParallelism());
        } catch (RuntimeException e) {
            return 1;
        }
    }

    private static int parse(String value, String what) {
        int slots;
        try {
            slots = Integer.parseInt(value.strip().toLowerCase(Locale.ROOT));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(what + " must be a number of task slots (1 or more), got '" + value
                    + "'");
        }
        if (slots < 1) {
            throw new IllegalArgumentException(what + " must be at least 1, got " + slots);
        }
        return slots;
    }
}
