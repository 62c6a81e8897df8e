package org.sparkflow.exchange.catalog;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.sparkflow.exchange.write.ExchangeWriteBuilder;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * An exchange a create or replace is about to write: declared (overwrite) when its write runs. Staged (the
 * catalog is a {@code StagingTableCatalog}), so a replace is atomic: the old exchange is not dropped first; the
 * write's overwrite keeps the committed version until it commits, and a replace whose write fails leaves the
 * exchange as it was. A replace without a query (nothing written) drops the old exchange at its commit.
 */
final class NewExchangeTable implements SupportsWrite, StagedTable {
    private final String name;
    private final StructType schema;
    private final Transform[] partitions;
    private final Map<String, String> properties;
    private final WriteSettings settings;
    private final CoordinatorClient coordinator;
    private final Map<String, String> catalogSettings;
    private final boolean replaces;
    private volatile boolean written;

    NewExchangeTable(String name, StructType schema, Transform[] partitions, Map<String, String> properties,
                     WriteSettings settings, CoordinatorClient coordinator, Map<String, String> catalogSettings,
                     boolean replaces) {
        this.name = name;
        this.schema = schema;
        this.partitions = partitions;
        this.properties = properties;
        this.settings = settings;
        this.coordinator = coordinator;
        this.catalogSettings = catalogSettings;
        this.replaces = replaces;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public StructType schema() {
        return schema;
    }

    @Override
    public Transform[] partitioning() {
        return partitions;
    }

    @Override
    public Map<String, String> properties() {
        return properties;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_WRITE, TableCapability.TRUNCATE); // a replace writes it by truncate
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        written = true;
        return new ExchangeWriteBuilder(name, settings, null, info, coordinator, catalogSettings);
    }

    /** The write (if any) committed its own overwrite; a replace that wrote nothing leaves no old exchange. */
    @Override
    public void commitStagedChanges() {
        if (replaces && !written) {
            coordinator.drop(name);
        }
    }

    /** Nothing to undo: a failed write's overwrite aborted at the coordinator, which kept the committed version. */
    @Override
    public void abortStagedChanges() {
    }
}
