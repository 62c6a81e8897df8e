package org.sparkflow.exchange.catalog;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.sparkflow.exchange.write.ExchangeWriteBuilder;
import org.sparkflow.exchange.write.WriteSettings;

/** An exchange a create or replace is about to write: declared (overwrite) when its write runs. */
final class NewExchangeTable implements SupportsWrite {
    private final String name;
    private final StructType schema;
    private final Transform[] partitions;
    private final Map<String, String> properties;
    private final WriteSettings settings;
    private final CoordinatorClient coordinator;
    private final Map<String, String> catalogSettings;

    NewExchangeTable(String name, StructType schema, Transform[] partitions, Map<String, String> properties,
                     WriteSettings settings, CoordinatorClient coordinator, Map<String, String> catalogSettings) {
        this.name = name;
        this.schema = schema;
        this.partitions = partitions;
        this.properties = properties;
        this.settings = settings;
        this.coordinator = coordinator;
        this.catalogSettings = catalogSettings;
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
        return new ExchangeWriteBuilder(name, settings, null, info, coordinator, catalogSettings);
    }
}
