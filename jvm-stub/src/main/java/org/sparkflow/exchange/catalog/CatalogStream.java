package org.sparkflow.exchange.catalog;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.contract.Contract.Option;
import org.sparkflow.exchange.stream.StreamSink;
import org.sparkflow.exchange.stream.StreamTable;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * A stream of the catalog: {@code readStream.table("<catalog>.<stream>")} reads it with the JVM stream source and
 * {@code writeStream.toTable("<catalog>.<stream>")} writes it with the JVM stream sink, under the query's options
 * (as {@code writeStream.format("pipelined")} with them would). A stream not declared yet (Spark creates the table
 * before its first {@code toTable}) can be written only.
 */
final class CatalogStream implements SupportsRead, SupportsWrite {
    private final String name;
    private final StreamTable read; // null: not declared yet
    private final Map<String, String> discovery;

    CatalogStream(String name, StreamTable read, Map<String, String> discovery) {
        this.name = name;
        this.read = read;
        this.discovery = new HashMap<>(discovery);
    }

    @Override
    public String name() {
        return name;
    }

    /** What a writer query's progress names as its sink (as the format route's JVM sink). */
    @Override
    public String toString() {
        return "sparkflow-exchange stream " + name + " (JVM sink)";
    }

    @Override
    public StructType schema() {
        return read != null ? read.schema() : new StructType();
    }

    @Override
    public Map<String, String> properties() {
        return Map.of();
    }

    @Override
    public Set<TableCapability> capabilities() {
        return read != null
                ? EnumSet.of(TableCapability.MICRO_BATCH_READ, TableCapability.STREAMING_WRITE,
                        TableCapability.ACCEPT_ANY_SCHEMA)
                : EnumSet.of(TableCapability.STREAMING_WRITE, TableCapability.ACCEPT_ANY_SCHEMA);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        if (read == null) {
            throw new UnsupportedOperationException("stream '" + name + "' is not declared yet: a writer query "
                    + "declares it (writeStream.toTable or writeStream.format(\"pipelined\")) before it can be read");
        }
        return read.newScanBuilder(options);
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        Map<String, String> options = new HashMap<>(info.options().asCaseSensitiveMap());
        options.keySet().removeIf(k -> k.equalsIgnoreCase(Option.EXCHANGE));
        options.put(Option.EXCHANGE, name);
        String why = StreamSink.unsupported(options, WriteSettings.OPTIONS);
        if (why != null) {
            throw new IllegalArgumentException("writeStream.toTable(\"<catalog>." + name + "\") writes through the "
                    + "JVM stream sink, which cannot serve this query (" + why + "): give it numSubpartitions and the "
                    + "partitioner hash or rebalance, or write with writeStream.format(\"pipelined\")");
        }
        return new StreamSink(name, options, discovery).newWriteBuilder(info);
    }
}
