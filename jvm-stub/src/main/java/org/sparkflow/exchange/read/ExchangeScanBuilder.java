package org.sparkflow.exchange.read;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructType;
import org.sparkflow.exchange.catalog.ExchangeDescription;

/** Builds the scan; keeps only the columns the query needs (each read task then hands Spark only those). */
public final class ExchangeScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
    private final ExchangeDescription desc;
    private final ReadSettings settings;
    private StructType required;

    public ExchangeScanBuilder(ExchangeDescription desc, ReadSettings settings) {
        this.desc = desc;
        this.settings = settings;
        this.required = desc.sparkSchema();
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        this.required = requiredSchema;
    }

    @Override
    public Scan build() {
        return new ExchangeScan(desc, settings, required);
    }
}
