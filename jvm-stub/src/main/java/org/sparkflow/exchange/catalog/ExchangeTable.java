package org.sparkflow.exchange.catalog;

import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.read.ExchangeScanBuilder;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.write.ExchangeWriteBuilder;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * An exchange that is declared, as a table: read, or appended to with its own layout (or replaced, through Spark's
 * truncate); its partitioning is {@code bucket(n, k)} when the writer hashed one key into n. One that a write is
 * about to declare is a {@link NewExchangeTable}.
 */
public final class ExchangeTable implements SupportsRead, SupportsWrite {
    private final ExchangeDescription desc;
    private final ReadSettings settings;
    private final CoordinatorClient coordinator;
    private final Map<String, String> catalogSettings;
    private final String readPartitions; // when the read's options do not say; null: readPartitions=auto

    public ExchangeTable(ExchangeDescription desc, ReadSettings settings, CoordinatorClient coordinator,
                         Map<String, String> catalogSettings) {
        this(desc, settings, coordinator, catalogSettings, null);
    }

    public ExchangeTable(ExchangeDescription desc, ReadSettings settings, CoordinatorClient coordinator,
                         Map<String, String> catalogSettings, String readPartitions) {
        this.desc = desc;
        this.settings = settings;
        this.coordinator = coordinator;
        this.catalogSettings = catalogSettings;
        this.readPartitions = readPartitions;
    }

    @Override
    public String name() {
        return desc.name;
    }

    @Override
    public StructType schema() {
        return desc.sparkSchema();
    }

    @Override
    public Transform[] partitioning() {
        return desc.bucketedOnOneKey()
                ? new Transform[] {Expressions.bucket(desc.numSubpartitions, desc.keys.get(0))}
                : new Transform[0];
    }

    @Override
    public Map<String, String> properties() {
        return Map.of("provider", "sparkflow-exchange", "partitioner", desc.partitioner,
                "keys", String.join(",", desc.keys), "state", desc.state);
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE, TableCapability.TRUNCATE);
    }

    /** An append (the exchange's schema, partitioner, keys, width and partition type), or a replace (truncate). */
    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        WriteSettings layout = WriteSettings.defaults().withLayout(desc.partitioner, List.copyOf(desc.keys),
                desc.numSubpartitions, desc.partitionType);
        return new ExchangeWriteBuilder(desc.name, layout, desc.schemaBase64, info, coordinator, catalogSettings);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        if (readPartitions != null && !options.containsKey(ReadSettings.READ_PARTITIONS)) {
            Map<String, String> withWidth = new java.util.HashMap<>(options.asCaseSensitiveMap());
            withWidth.put(ReadSettings.READ_PARTITIONS, readPartitions);
            options = new CaseInsensitiveStringMap(withWidth);
        }
        return new ExchangeScanBuilder(desc, settings, options);
    }
}
