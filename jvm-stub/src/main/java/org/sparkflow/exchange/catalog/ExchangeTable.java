package org.sparkflow.exchange.catalog;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.read.ExchangeScanBuilder;
import org.sparkflow.exchange.read.ReadSettings;

/** One exchange as a read-only table; its partitioning is {@code bucket(n, k)} when the writer hashed one key into n. */
public final class ExchangeTable implements SupportsRead {
    private final ExchangeDescription desc;
    private final ReadSettings settings;

    public ExchangeTable(ExchangeDescription desc, ReadSettings settings) {
        this.desc = desc;
        this.settings = settings;
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
        return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new ExchangeScanBuilder(desc, settings);
    }
}
