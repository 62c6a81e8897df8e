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
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.write.ExchangeWriteBuilder;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * An exchange that a write is about to declare (the one table for that; {@link ExchangeTable} is a declared one). Two
 * kinds:
 * <ul>
 *   <li>{@link #staged}: a create or replace through the catalog, its layout from the table's properties and
 *       partitioning, declared (overwrite) when its write runs. Staged (the catalog is a {@code StagingTableCatalog}),
 *       so a replace is atomic: the old exchange is not dropped first; the write's overwrite keeps the committed
 *       version until it commits, and a replace whose write fails leaves the exchange as it was. A replace without
 *       a query (nothing written) drops the old exchange at its commit.</li>
 *   <li>{@link #fromWriteOptions}: a {@code format("pipelined")} write of an exchange not declared yet: its schema
 *       comes with the write (any schema is accepted), its layout from the write's options; mode append declares
 *       without replacing (a write that declared it meanwhile is appended to), overwrite replaces.</li>
 * </ul>
 */
public final class NewExchangeTable implements SupportsWrite, StagedTable {
    private final String name;
    private final StructType schema;
    private final Transform[] partitions;
    private final Map<String, String> properties;
    private final WriteSettings settings; // null: the defaults when the write is built, the options over them
    private final CoordinatorClient coordinator;
    private final Map<String, String> catalogSettings;
    private final boolean replaces;
    private final boolean fromOptions;
    private volatile boolean written;

    private NewExchangeTable(String name, StructType schema, Transform[] partitions, Map<String, String> properties,
                             WriteSettings settings, CoordinatorClient coordinator, Map<String, String> catalogSettings,
                             boolean replaces, boolean fromOptions) {
        this.name = name;
        this.schema = schema;
        this.partitions = partitions;
        this.properties = properties;
        this.settings = settings;
        this.coordinator = coordinator;
        this.catalogSettings = catalogSettings;
        this.replaces = replaces;
        this.fromOptions = fromOptions;
    }

    /** A catalog's create ({@code replaces} false) or replace of {@code name}, in the layout {@code settings} say. */
    static NewExchangeTable staged(String name, StructType schema, Transform[] partitions,
                                   Map<String, String> properties, WriteSettings settings,
                                   CoordinatorClient coordinator, Map<String, String> catalogSettings,
                                   boolean replaces) {
        return new NewExchangeTable(name, schema, partitions, properties, settings, coordinator, catalogSettings,
                replaces, false);
    }

    /** A {@code format("pipelined")} write of {@code name}, not declared yet: schema and layout come with the write. */
    public static NewExchangeTable fromWriteOptions(String name, CoordinatorClient coordinator,
                                                    Map<String, String> catalogSettings) {
        return new NewExchangeTable(name, new StructType(), new Transform[0], Map.of(), null, coordinator,
                catalogSettings, false, true);
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
        // a replace writes it by truncate; a write from options brings its own schema
        return fromOptions
                ? EnumSet.of(TableCapability.BATCH_WRITE, TableCapability.TRUNCATE, TableCapability.ACCEPT_ANY_SCHEMA)
                : EnumSet.of(TableCapability.BATCH_WRITE, TableCapability.TRUNCATE);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        written = true;
        if (fromOptions) {
            return new ExchangeWriteBuilder(name, WriteSettings.defaults(), null, info, coordinator, catalogSettings)
                    .appending();
        }
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
