package org.sparkflow.exchange.stream;

import java.io.Serializable;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * A JVM stream read's options, under the Python source's names and with its defaults ({@code config.py}:
 * consumerGroup, startingEpochs, maxEpochsPerTrigger, maxRowsPerTrigger, maxBytesPerTrigger, stream.pollWait,
 * declareTimeout).
 */
public record StreamSettings(String stream, String group, String startingEpochs, Integer maxEpochs, Long maxRows,
                             Long maxBytes, double pollWaitSeconds, double declareTimeoutSeconds)
        implements Serializable {
    /** Read options the JVM stream source honours (lower case, as Spark's options map keeps them). */
    public static final Set<String> READ_OPTIONS = Set.of("exchange", "consumergroup", "startingepochs",
            "maxepochspertrigger", "maxrowspertrigger", "maxbytespertrigger", "stream.pollwait", "declaretimeout",
            "path");
    static final double POLL_WAIT_SECONDS = 0.5; // config.py stream_poll_wait
    static final double DECLARE_TIMEOUT_SECONDS = 60.0; // config.py declare_timeout

    /** The settings of {@code options} (keys in any case); bad values fail naming the option. */
    public static StreamSettings of(String stream, Map<String, String> options) {
        Map<String, String> o = new java.util.HashMap<>();
        options.forEach((k, v) -> o.put(k.toLowerCase(Locale.ROOT), v));
        String start = o.getOrDefault("startingepochs", "earliest").trim().toLowerCase(Locale.ROOT);
        if (!start.equals("earliest") && !start.equals("latest")) {
            throw new IllegalArgumentException("unknown startingEpochs '" + start + "'; use earliest or latest");
        }
        String group = o.get("consumergroup");
        return new StreamSettings(stream, group == null || group.isBlank() ? null : group.trim(), start,
                positiveInt(o, "maxepochspertrigger", "maxEpochsPerTrigger"),
                positiveLong(o, "maxrowspertrigger", "maxRowsPerTrigger"),
                o.containsKey("maxbytespertrigger") ? Long.valueOf(WriteSettings.size("maxBytesPerTrigger",
                        o.get("maxbytespertrigger"))) : null,
                seconds(o, "stream.pollwait", "stream.pollWait", POLL_WAIT_SECONDS),
                seconds(o, "declaretimeout", "declareTimeout", DECLARE_TIMEOUT_SECONDS));
    }

    private static Integer positiveInt(Map<String, String> o, String key, String name) {
        Long v = positiveLong(o, key, name);
        return v == null ? null : (int) Math.min(Integer.MAX_VALUE, v);
    }

    private static Long positiveLong(Map<String, String> o, String key, String name) {
        String v = o.get(key);
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

    private static double seconds(Map<String, String> o, String key, String name, double dflt) {
        String v = o.get(key);
        return v == null ? dflt : WriteSettings.duration(name, v) / 1e9;
    }
}
