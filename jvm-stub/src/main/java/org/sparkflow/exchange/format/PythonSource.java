package org.sparkflow.exchange.format;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The Python data source {@code pipelined} (installed with the package), for what the JVM path does not serve. */
final class PythonSource {
    private PythonSource() {}

    /** Spark's provider of the Python source, as Spark itself makes one for a Python data source's name. */
    static PythonDataSourceV2 provider() {
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(PipelinedFormat.SHORT_NAME);
        return provider;
    }

    /** The Python source's table to read: its schema is the exchange's, as the Python source describes it. */
    static Table forRead(CaseInsensitiveStringMap options) {
        PythonDataSourceV2 provider = provider();
        return provider.getTable(provider.inferSchema(options), new Transform[0], options.asCaseSensitiveMap());
    }

    /** The Python source's table to write: the query's schema reaches it with the write (Spark passes it then). */
    static Table forWrite(CaseInsensitiveStringMap options) {
        return new AnySchemaWrite(provider().getTable(new StructType(), new Transform[0], options.asCaseSensitiveMap()));
    }

    /**
     * A Python table for a write planned through the catalog. Spark would check the query against the table's
     * schema, which a catalog cannot know before the write (the Python source gets it with the write itself).
     */
    private static final class AnySchemaWrite implements SupportsWrite {
        private final Table python;

        AnySchemaWrite(Table python) {
            this.python = python;
        }

        @Override
        public String name() {
            return python.name();
        }

        @Override
        public StructType schema() {
            return new StructType();
        }

        @Override
        public Map<String, String> properties() {
            return python.properties();
        }

        @Override
        public Set<TableCapability> capabilities() {
            Set<TableCapability> out = EnumSet.of(TableCapability.ACCEPT_ANY_SCHEMA);
            out.addAll(python.capabilities());
            return out;
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return ((SupportsWrite) python).newWriteBuilder(info);
        }
    }
}
