package org.sparkflow.exchange.format;

import java.util.Arrays;
import java.util.stream.Collectors;
import java.util.Locale;
import java.util.Set;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.read.ExchangeScan;
import org.sparkflow.exchange.stream.StreamSettings;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.contract.Contract.Option;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * Which options of {@code format("pipelined")} the JVM path serves. A read or write that asks for anything else
 * (no explicit numSubpartitions, a custom partitioner, waiting for an exchange to be declared, per-read connection settings, ...)
 * goes to the Python data source, which serves every option.
 */
final class Route {
    /** Read options the JVM reader honours (lower case, as Spark's options map keeps them). */
    static final Set<String> READ_OPTIONS = lower(Option.EXCHANGE, Option.READ_PARTITIONS, Option.TASK_SLOTS,
            Option.DECLARE_TIMEOUT);
    /** Write options the JVM writer honours, under the Python options' names. */
    static final Set<String> WRITE_OPTIONS = WriteSettings.OPTIONS;

    /** Layouts the JVM reader reads as the Python reader does (every producer holds every subpartition). */
    static final Set<String> READ_PARTITIONERS = Set.copyOf(Contract.Partitioner.JVM_READ); // hash, rebalance

    private Route() {}

    /** Null when a stream read's options fit the JVM stream source, else the first reason they do not. */
    static String streamPythonOnly(CaseInsensitiveStringMap options) {
        String exchange = options.get(Option.EXCHANGE);
        if (exchange == null || exchange.isEmpty()) {
            return "no exchange option";
        }
        for (String key : options.keySet()) {
            if (!StreamSettings.READ_OPTIONS.contains(key.toLowerCase(Locale.ROOT))) {
                return "option " + key;
            }
        }
        return null;
    }

    private static Set<String> lower(String... keys) {
        return Arrays.stream(keys).map(k -> k.toLowerCase(Locale.ROOT)).collect(Collectors.toUnmodifiableSet());
    }

    /** Null when the options fit the JVM path, else the first reason they do not. */
    static String pythonOnly(CaseInsensitiveStringMap options, boolean write) {
        String exchange = options.get(Option.EXCHANGE);
        if (exchange == null || exchange.isEmpty()) {
            return "no exchange option";
        }
        Set<String> known = write ? WRITE_OPTIONS : READ_OPTIONS;
        for (String key : options.keySet()) {
            if (!known.contains(key.toLowerCase(Locale.ROOT))) {
                return "option " + key;
            }
        }
        if (write) {
            if (!"0".equals(sessionReplicas().trim())) { // the Python writer pushes each partition's copies
                return Option.REPLICAS + " (session setting)";
            }
            if (!options.containsKey(Option.NUM_SUBPARTITIONS)) { // the Python writer's coalesced layout: its own
                return "no numSubpartitions";
            }
            String partitioner = options.getOrDefault(Option.PARTITIONER, Contract.OptionDefault.PARTITIONER).toLowerCase(Locale.ROOT);
            if (!WriteSettings.PARTITIONERS.contains(partitioner)) {
                return "partitioner " + partitioner;
            }
        }
        return null;
    }

    /** {@code spark.sparkflow.exchange.replicas} of the active session (the option itself routes as any option). */
    static String sessionReplicas() {
        scala.Option<SparkSession> session = SparkSession.getActiveSession();
        String value = session.isDefined() ? session.get().conf().get(Option.PREFIX + Option.REPLICAS, null) : null;
        return value == null ? String.valueOf(Contract.OptionDefault.REPLICAS) : value;
    }

    /**
     * Null when the JVM reader reads this exchange as the Python reader does (what the catalog's reader reads, written
     * hash or rebalance with an explicit width: partition i reads subpartition i; one being written as it goes),
     * else why not ({@code whileWritten} false: one being written is refused). A null description: not declared.
     */
    static String unreadable(ExchangeDescription desc, boolean whileWritten) {
        if (desc == null) {
            return "not declared";
        }
        String why = ExchangeScan.unreadable(desc, whileWritten);
        if (why != null) {
            return why;
        }
        if (!READ_PARTITIONERS.contains(desc.partitioner)) { // broadcast: the Python reader's layout
            return "partitioner " + desc.partitioner;
        }
        return desc.coalesce ? "written without numSubpartitions" : null;
    }
}
