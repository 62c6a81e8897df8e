package org.sparkflow.exchange.write;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.SupportsTruncate;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.sparkflow.exchange.coordinator.CoordinatorClient;

/**
 * A catalog write of one exchange: {@code create}/{@code createOrReplace} (a new exchange, or one replaced through
 * Spark's truncate: declared in overwrite mode with the query's schema) or {@code append} (the exchange's own
 * schema, partitioner and width; the write's options may only repeat them). Settings are checked when Spark builds
 * the write, at planning; the exchange is declared when Spark asks for the batch write, just before its tasks start.
 */
public final class ExchangeWriteBuilder implements SupportsTruncate, Write {
    private final String name;
    private final StructType schema;
    private final WriteSettings base;
    private final Map<String, String> options;
    private final CoordinatorClient coordinator;
    private final Map<String, String> discovery;
    private String declaredSchema;
    private boolean overwrite;
    private WriteSettings settings;

    /**
     * {@code base}: the table's settings (a new exchange's properties, an existing one's layout);
     * {@code declaredSchema}: the existing exchange's schema to append to, null for a new exchange.
     */
    public ExchangeWriteBuilder(String name, WriteSettings base, String declaredSchema, LogicalWriteInfo info,
                                CoordinatorClient coordinator, Map<String, String> discovery) {
        this.name = name;
        this.schema = info.schema();
        this.base = base;
        this.options = new HashMap<>(info.options().asCaseSensitiveMap());
        this.declaredSchema = declaredSchema;
        this.overwrite = declaredSchema == null;
        this.coordinator = coordinator;
        this.discovery = new HashMap<>(discovery);
    }

    /** Every row replaced ({@code createOrReplace} of an existing exchange, {@code overwrite(lit(true))}). */
    @Override
    public WriteBuilder truncate() {
        declaredSchema = null;
        overwrite = true;
        return this;
    }

    /** A new exchange declared without replacing: unless Spark truncates, a write that declared it first is kept. */
    public ExchangeWriteBuilder appending() {
        overwrite = false;
        return this;
    }

    @Override
    public Write build() {
        WriteSettings s = base.with(List.of(options)).checked();
        if (declaredSchema != null && (!s.partitioner().equals(base.partitioner()) || !s.keys().equals(base.keys())
                || !Objects.equals(s.numSubpartitions(), base.numSubpartitions()))) {
            throw new IllegalArgumentException("an append to exchange '" + name + "' writes its layout: partitioner "
                    + base.partitioner() + ", keys " + base.keys() + ", numSubpartitions " + base.numSubpartitions()
                    + "; the write's options ask for " + s.partitioner() + ", " + s.keys() + ", "
                    + s.numSubpartitions() + " (write it again with createOrReplace to change it)");
        }
        if (!s.single() && s.numSubpartitions() == null) { // the width of a shuffle of this session
            s = s.withLayout(s.partitioner(), s.keys(), SQLConf.get().numShufflePartitions(), s.partitionType());
        }
        // the keys are columns, their types hashable: fails here, not in every task
        new RowRouter(new WriteHandle(name, 0, "", "", schema, s.numSubpartitions(), s, new HashMap<>()), 0);
        settings = s;
        return this;
    }

    @Override
    public String description() {
        return "exchange " + name + " (" + settings.partitioner()
                + (settings.keys().isEmpty() ? "" : " on " + String.join(", ", settings.keys()))
                + (settings.numSubpartitions() == null ? "" : " into " + settings.numSubpartitions()) + ")";
    }

    @Override
    public BatchWrite toBatch() {
        return ExchangeBatchWrite.declare(coordinator, name, schema, declaredSchema, settings, overwrite,
                discovery);
    }
}
