package org.sparkflow.exchange;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * Gauges in Spark's metrics system (the plugin's registry: Prometheus servlet, JMX and every other
 * sink) fed by the local exchange service's Prometheus text. The service is read at most once per
 * {@link #MAX_AGE_MS} whatever the sinks' polling; an unreachable service reads as zeros.
 *
 * <p>Names follow Flink's task I/O metrics where one exists. The executor's gauges describe its
 * exchange service (shared by the executors of a host with serviceScope=host); the driver's describe
 * the coordinator.
 */
final class ServiceGauges {
    static final long MAX_AGE_MS = 5_000;
    private static final int TIMEOUT_MS = 2_000;
    private static final int BODY_LIMIT = 64 << 20;

    private final URL url;
    private long readAt = Long.MIN_VALUE;
    private Map<String, Double> sums = new HashMap<>();
    private Map<String, Double> maxima = new HashMap<>();
    private Map<String, Set<String>> exchanges = new HashMap<>();

    private ServiceGauges(URL url) {
        this.url = url;
    }

    /** Registers the executor's gauges; nothing when the service serves no metrics. */
    static void registerExecutor(MetricRegistry registry, String metricsUrl) {
        ServiceGauges s = of(metricsUrl);
        if (s == null) {
            return;
        }
        gauge(registry, "numBytesOut", s, "sparkflow_partition_bytes_total", false);
        gauge(registry, "numBuffersOut", s, "sparkflow_partition_buffers_total", false);
        gauge(registry, "numBytesIn", s, "sparkflow_read_bytes_total", false);
        gauge(registry, "numBuffersIn", s, "sparkflow_exchange_read_buffers", false);
        gauge(registry, "spilledBytes", s, "sparkflow_disk_used_bytes", false);
        gauge(registry, "memoryUsedBytes", s, "sparkflow_memory_used_bytes", false);
        gauge(registry, "memoryBudgetBytes", s, "sparkflow_memory_budget_bytes", false);
        registry.register("backPressuredTimeMsPerSecond", (Gauge<Long>) () ->
                Math.round(1000 * s.value("sparkflow_partition_backpressure_ratio", true)));
        registry.register("outPoolUsage", (Gauge<Double>) () -> {
            double budget = s.value("sparkflow_memory_budget_bytes", false);
            return budget > 0 ? s.value("sparkflow_memory_used_bytes", false) / budget : 0.0;
        });
        registry.register("exchangesHeld", (Gauge<Integer>) () -> s.exchangeCount("sparkflow_exchange_written_bytes"));
    }

    /** Registers the driver's gauges (the coordinator's view); nothing when it serves no metrics. */
    static void registerDriver(MetricRegistry registry, String metricsUrl) {
        ServiceGauges s = of(metricsUrl);
        if (s == null) {
            return;
        }
        gauge(registry, "exchanges", s, "sparkflow_exchanges", false);
        gauge(registry, "coordinatorConnections", s, "sparkflow_connections", false);
    }

    private static ServiceGauges of(String metricsUrl) {
        if (metricsUrl == null || metricsUrl.isEmpty()) {
            return null; // a service started without metrics (by an older launcher) was joined: no gauges
        }
        try {
            return new ServiceGauges(new URL(metricsUrl));
        } catch (IOException e) {
            System.err.println("WARN sparkflow-exchange: bad metrics URL " + metricsUrl + ": " + e.getMessage());
            return null;
        }
    }

    private static void gauge(MetricRegistry registry, String name, ServiceGauges s, String metric, boolean max) {
        registry.register(name, (Gauge<Long>) () -> Math.round(s.value(metric, max)));
    }

    /** The sum (or the largest) of a metric's samples in the latest reading. */
    synchronized double value(String metric, boolean max) {
        refresh();
        Double v = (max ? maxima : sums).get(metric);
        return v == null ? 0.0 : v;
    }

    synchronized int exchangeCount(String metric) {
        refresh();
        Set<String> names = exchanges.get(metric);
        return names == null ? 0 : names.size();
    }

    private void refresh() {
        long now = System.currentTimeMillis();
        if (readAt != Long.MIN_VALUE && now - readAt < MAX_AGE_MS) {
            return;
        }
        readAt = now;
        Map<String, Double> s = new HashMap<>();
        Map<String, Double> m = new HashMap<>();
        Map<String, Set<String>> ex = new HashMap<>();
        try {
            for (String line : fetch().split("\n")) {
                parse(line, s, m, ex);
            }
        } catch (IOException | RuntimeException e) {
            // the service is gone or busy: zeros until it answers again
        }
        sums = s;
        maxima = m;
        exchanges = ex;
    }

    private String fetch() throws IOException {
        HttpURLConnection c = (HttpURLConnection) url.openConnection();
        c.setConnectTimeout(TIMEOUT_MS);
        c.setReadTimeout(TIMEOUT_MS);
        try (InputStream in = c.getInputStream()) {
            return new String(in.readNBytes(BODY_LIMIT), StandardCharsets.UTF_8);
        } finally {
            c.disconnect();
        }
    }

    /** One exposition line: {@code name{labels} value}; comments and anything unreadable are skipped. */
    static void parse(String line, Map<String, Double> sums, Map<String, Double> maxima,
                      Map<String, Set<String>> exchanges) {
        if (line.isEmpty() || line.startsWith("#")) {
            return;
        }
        int brace = line.indexOf('{');
        int space = line.lastIndexOf(' ');
        if (space <= 0) {
            return;
        }
        String name = line.substring(0, brace > 0 && brace < space ? brace : line.indexOf(' ')).trim();
        double value;
        try {
            value = Double.parseDouble(line.substring(space + 1).trim());
        } catch (NumberFormatException e) {
            return;
        }
        sums.merge(name, value, Double::sum);
        maxima.merge(name, value, Math::max);
        int at = line.indexOf("exchange=\"");
        if (at >= 0) {
            exchanges.computeIfAbsent(name, k -> new HashSet<>()).add(labelValue(line, at + 10));
        }
    }

    /** A label value up to its closing quote, escapes kept (only told apart, never shown). */
    private static String labelValue(String line, int from) {
        int i = from;
        while (i < line.length() && line.charAt(i) != '"') {
            i += line.charAt(i) == '\\' ? 2 : 1;
        }
        return line.substring(from, Math.min(i, line.length()));
    }
}
