package org.sparkflow.exchange.read;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.SortedSet;
import org.apache.spark.network.util.JavaUtils;
import org.apache.spark.sql.internal.SQLConf;

/**
 * Which subpartitions each read partition reads. Read partition j of m reads subpartitions {@code j, j + m, ...}
 * with m a divisor of the width n: since {@code pmod(h, n) mod m = pmod(h, m)} when m divides n, every row of
 * read partition j is in {@code bucket(m, k)} = j, so a hash exchange stays key-grouped at any such m.
 *
 * <p>{@code readPartitions=auto} (the default) picks m as Spark's adaptive execution coalesces a shuffle of the
 * same size: each read partition at most {@code spark.sql.adaptive.advisoryPartitionSizeInBytes}, and, with
 * {@code coalescePartitions.parallelismFirst}, at most the size over the default parallelism (not below
 * {@code minPartitionSize}); the smallest divisor of n that keeps to that. Without adaptive execution or sizes:
 * one read partition per subpartition. A read planned while the exchange is written ({@code live}) is laid out to
 * the reading application's task slots instead ({@link TaskSlots}; for a key-grouped read the largest
 * divisor of n not above it): every read task can then run while the producers write, as Flink schedules the
 * consumers of a pipelined exchange together; a task beyond the slots would start only when one ends, after the
 * write. A number asks for exactly that many (a divisor of n for a key-grouped read).
 *
 * <p>{@code slots}: the task slots a live read was laid out to (0: not laid out to slots).
 */
record ReadLayout(int groups, List<int[]> members, int slots) {
    static final String OPTION = ReadSettings.READ_PARTITIONS;

    /** The layout of a read of subpartitions {@code kept} (ascending) of an exchange of width {@code n}. */
    static ReadLayout plan(String exchange, int n, SortedSet<Integer> kept, long[] subpartitionBytes,
                           String requested, boolean keyGrouped, boolean live, String taskSlots) {
        return plan(exchange, n, kept, subpartitionBytes, requested, keyGrouped, live,
                live ? TaskSlots.of(taskSlots) : 0);
    }

    /** As above, with the reading application's task slots given ({@code slots}). */
    static ReadLayout plan(String exchange, int n, SortedSet<Integer> kept, long[] subpartitionBytes,
                           String requested, boolean keyGrouped, boolean live, int slots) {
        boolean toSlots = live && isAuto(requested);
        int m = toSlots ? toSlots(n, keyGrouped, slots)
                : width(exchange, n, kept, subpartitionBytes, requested, keyGrouped);
        List<int[]> members = new ArrayList<>();
        for (int j = 0; j < m; j++) {
            final int g = j;
            members.add(kept.stream().filter(i -> i % m == g).mapToInt(Integer::intValue).toArray());
        }
        return new ReadLayout(m, members, live ? Math.max(1, slots) : 0);
    }

    private static boolean isAuto(String requested) {
        return requested == null || requested.strip().equalsIgnoreCase("auto");
    }

    /** As many read partitions as task slots, at most n; for a key-grouped read the largest divisor of n within. */
    static int toSlots(int n, boolean keyGrouped, int slots) {
        int m = Math.max(1, Math.min(n, slots));
        while (keyGrouped && n % m != 0) {
            m--;
        }
        return m;
    }

    /**
     * A broadcast's layout: every subpartition holds every row, so read partition j reads subpartition j alone
     * ({@code shared}: each producer's one subpartition, 0, which every reader reads), one copy of each row per
     * read partition; {@code auto} reads n partitions, a number m of 1 to n the first m.
     */
    static ReadLayout copies(String exchange, int n, String requested, boolean shared) {
        String value = requested == null ? "auto" : requested.strip().toLowerCase(Locale.ROOT);
        int m = n;
        if (!value.equals("auto")) {
            try {
                m = Integer.parseInt(value);
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(OPTION + " of exchange '" + exchange + "' must be auto or a "
                        + "number of read partitions, got '" + requested + "'");
            }
            if (m < 1 || m > n) {
                throw new IllegalArgumentException(OPTION + "=" + m + " for broadcast exchange '" + exchange + "' of "
                        + n + " copies: give a number from 1 to " + n + " (each read partition reads one copy)");
            }
        }
        List<int[]> members = new ArrayList<>();
        for (int j = 0; j < m; j++) {
            members.add(new int[] {shared ? 0 : j});
        }
        return new ReadLayout(m, members, 0);
    }

    private static int width(String exchange, int n, SortedSet<Integer> kept, long[] subpartitionBytes,
                             String requested, boolean keyGrouped) {
        String value = requested == null ? "auto" : requested.strip().toLowerCase(Locale.ROOT);
        if (!value.equals("auto")) {
            int m;
            try {
                m = Integer.parseInt(value);
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(OPTION + " of exchange '" + exchange + "' must be auto or a "
                        + "number of read partitions, got '" + requested + "'");
            }
            if (m < 1 || m > n || (keyGrouped && n % m != 0)) {
                throw new IllegalArgumentException(OPTION + "=" + m + " for exchange '" + exchange + "' of " + n
                        + " subpartitions: give " + (keyGrouped ? "a divisor of " + n + " (each read partition "
                        + "then holds whole buckets)" : "a number from 1 to " + n));
            }
            return m;
        }
        SQLConf conf = SQLConf.get();
        if (subpartitionBytes == null || !conf.adaptiveExecutionEnabled() || !bool(conf,
                "spark.sql.adaptive.coalescePartitions.enabled", true)) {
            return n;
        }
        long total = 0;
        for (int i : kept) {
            total += subpartitionBytes[i];
        }
        long advisory = size(conf, "spark.sql.adaptive.advisoryPartitionSizeInBytes",
                conf.getConfString("spark.sql.adaptive.shuffle.targetPostShuffleInputSize", "64m"));
        long target = advisory;
        if (bool(conf, "spark.sql.adaptive.coalescePartitions.parallelismFirst", true)) {
            long minimum = size(conf, "spark.sql.adaptive.coalescePartitions.minPartitionSize", "1m");
            target = Math.max(minimum, Math.min(advisory, total / TaskSlots.defaultParallelism()));
        }
        for (int m = 1; m < n; m++) {
            if (n % m == 0 && largestGroup(m, kept, subpartitionBytes) <= target) {
                return m;
            }
        }
        return n;
    }

    private static long largestGroup(int m, SortedSet<Integer> kept, long[] bytes) {
        long[] sums = new long[m];
        long largest = 0;
        for (int i : kept) {
            sums[i % m] += bytes[i];
            largest = Math.max(largest, sums[i % m]);
        }
        return largest;
    }

    private static boolean bool(SQLConf conf, String key, boolean otherwise) {
        return Boolean.parseBoolean(conf.getConfString(key, String.valueOf(otherwise)).strip());
    }

    private static long size(SQLConf conf, String key, String otherwise) {
        return JavaUtils.byteStringAsBytes(conf.getConfString(key, otherwise).strip());
    }
}
