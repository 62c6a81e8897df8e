package org.sparkflow.exchange.stream;

import java.io.Serializable;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.sparkflow.exchange.contract.Contract.Option;
import org.sparkflow.exchange.contract.Contract.OptionChoices;
import org.sparkflow.exchange.contract.Contract.OptionDefault;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * A JVM stream read's options, under the Python source's names and with its defaults (the contract's, which
 * {@code config.py} reads too: consumerGroup, startingEpochs, maxEpochsPerTrigger, maxRowsPerTrigger,
 * maxBytesPerTrigger, stream.pollWait, declareTimeout).
 */
public record StreamSettings(String stream, String group, String startingEpochs, Integer maxEpochs, Long maxRows,
                             Long maxBytes, double pollWaitSeconds, double declareTimeoutSeconds)
        implements Serializable {
    /** Spark's own option: the path a query's load() or start() may pass. */
    static final String SPARK_PATH = "path";
    /** Read options the JVM stream source honours (lower case, as Spark's options map keeps them). */
    public static final Set<String> READ_OPTIONS = lower(Option.EXCHANGE, Option.CONSUMER_GROUP,
            Option.STARTING_EPOCHS, Option.MAX_EPOCHS_PER_TRIGGER, Option.MAX_ROWS_PER_TRIGGER,
            Option.MAX_BYTES_PER_TRIGGER, Option.STREAM_POLL_WAIT, Option.DECLARE_TIMEOUT, SPARK_PATH);

    static Set<String> lower(String... keys) {
        return Stream.of(keys).map(k -> k.toLowerCase(Locale.ROOT)).collect(Collectors.toUnmodifiableSet());
    }

    /** The settings of {@code options} (keys in any case); bad values fail naming the option. */
    public static StreamSettings of(String stream, Map<String, String> options) {
        Map<String, String> o = new java.util.HashMap<>();
        options.forEach((k, v) -> o.put(k.toLowerCase(Locale.ROOT), v));
        String start = o.getOrDefault(key(Option.STARTING_EPOCHS), OptionDefault.STARTING_EPOCHS).trim()
                .toLowerCase(Locale.ROOT);
        if (!OptionChoices.STARTING_EPOCHS.contains(start)) {
            throw new IllegalArgumentException("unknown " + Option.STARTING_EPOCHS + " '" + start + "'; use one of "
                    + String.join(", ", OptionChoices.STARTING_EPOCHS));
        }
        String group = o.get(key(Option.CONSUMER_GROUP));
        String bytes = o.get(key(Option.MAX_BYTES_PER_TRIGGER));
        return new StreamSettings(stream, group == null || group.isBlank() ? null : group.trim(), start,
                positiveInt(o, Option.MAX_EPOCHS_PER_TRIGGER), positiveLong(o, Option.MAX_ROWS_PER_TRIGGER),
                bytes == null ? null : Long.valueOf(WriteSettings.size(Option.MAX_BYTES_PER_TRIGGER, bytes, Long.MAX_VALUE)),
                seconds(o, Option.STREAM_POLL_WAIT, OptionDefault.STREAM_POLL_WAIT),
                seconds(o, Option.DECLARE_TIMEOUT, OptionDefault.DECLARE_TIMEOUT));
    }

    private static String key(String option) {
        return option.toLowerCase(Locale.ROOT);
    }

    private static Integer positiveInt(Map<String, String> o, String name) {
        Long v = positiveLong(o, name);
        return v == null ? null : (int) Math.min(Integer.MAX_VALUE, v);
    }

    private static Long positiveLong(Map<String, String> o, String name) {
        String v = o.get(key(name));
        if (v == null || v.isBlank()) {
            return null;
        }
        try {
            long n = Long.parseLong(v.trim());
            if (n <= 0) {
                throw new NumberFormatException();
            }
            return n;
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be a positive whole number, got '" + v + "'");
        }
    }

    private static double seconds(Map<String, String> o, String name, double dflt) {
        String v = o.get(key(name));
        return v == null ? dflt : WriteSettings.duration(name, v) / 1e9;
    }
}
