package org.sparkflow.exchange.read;

import java.util.SortedSet;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.connector.read.SupportsPushDownV2Filters;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.coordinator.ExchangeDescription;

/**
 * Builds the scan; keeps only the columns the query needs (each read task then hands Spark only those) and, for a
 * hash exchange, only the subpartitions an equality or IN filter on every key can match. Filters are not taken
 * over: Spark applies each of them to the rows read.
 */
public final class ExchangeScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns,
        SupportsPushDownV2Filters {
    private final ExchangeDescription desc;
    private final ReadSettings settings;
    private final CaseInsensitiveStringMap options;
    private StructType required;
    private SortedSet<Integer> pruned; // null: every subpartition
    private Predicate[] pushed = new Predicate[0];

    public ExchangeScanBuilder(ExchangeDescription desc, ReadSettings settings, CaseInsensitiveStringMap options) {
        this.desc = desc;
        this.settings = settings;
        this.options = options;
        this.required = desc.sparkSchema();
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        this.required = requiredSchema;
    }

    @Override
    public Predicate[] pushPredicates(Predicate[] predicates) {
        if ("hash".equals(desc.partitioner) && !desc.keys.isEmpty() && desc.numSubpartitions != null
                && !desc.coalesce) {
            KeyFilter filter = new KeyFilter(desc.sparkSchema(), desc.keys);
            for (Predicate p : predicates) {
                filter.offer(p);
            }
            pruned = filter.subpartitions(desc.numSubpartitions);
            pushed = pruned == null ? new Predicate[0] : filter.used();
        }
        return predicates;
    }

    @Override
    public Predicate[] pushedPredicates() {
        return pushed;
    }

    @Override
    public Scan build() {
        return new ExchangeScan(desc, settings, required, pruned, options.get(ReadLayout.OPTION),
                options.get(TaskSlots.OPTION));
    }
}
