package org.sparkflow.exchange.format;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.read.TaskSlots;
import org.sparkflow.exchange.catalog.ExchangeCatalog;

/** The Python data source {@code pipelined} (installed with the package), for what the JVM path does not serve. */
final class PythonSource {
    /** The Python data source's name, which the jar's {@code format("pipelined")} takes over where it is loaded. */
    static final String NAME = "pipelined";

    private PythonSource() {}

    /** Spark's provider of the Python source, as Spark itself makes one for a Python data source's name. */
    static PythonDataSourceV2 provider() {
        PythonDataSourceV2 provider = new PythonDataSourceV2();
        provider.setShortName(NAME);
        return provider;
    }

    /**
     * The application's settings that name the coordinator and prove the secret: what the JVM path finds the
     * service with ({@link ExchangeCatalog#KEYS}) except the per-host ones ({@code hostId}, {@code service}),
     * which each executor's tasks take from their own host.
     */
    static final List<String> DISCOVERY = List.of(Contract.Option.COORDINATOR, Contract.Option.SECRET, Contract.Option.SECRET_FILE, Contract.Option.TLS_CA_FILE,
            Contract.Option.TLS_CERT_FILE, Contract.Option.TLS_CHECK_HOSTNAME);

    /**
     * {@code options} with the application's {@link #DISCOVERY} settings ({@code spark.sparkflow.exchange.*})
     * where the options do not give them: the Python source's planning workers do not see the session's settings
     * without {@code register(spark)}, and must find the service the JVM path finds from the same settings.
     */
    static Map<String, String> withSessionDiscovery(Map<String, String> options) {
        SparkConf conf = SparkEnv.get() != null ? SparkEnv.get().conf() : null;
        if (conf == null) {
            return options;
        }
        Set<String> given = new HashSet<>();
        options.keySet().forEach(k -> given.add(k.toLowerCase(Locale.ROOT)));
        Map<String, String> out = new HashMap<>(options);
        for (String key : DISCOVERY) {
            scala.Option<String> value = conf.getOption(Contract.Option.PREFIX + key);
            if (!given.contains(key.toLowerCase(Locale.ROOT)) && value.isDefined()) {
                out.put(key, value.get());
            }
        }
        return out;
    }

    static CaseInsensitiveStringMap withSessionDiscovery(CaseInsensitiveStringMap options) {
        return new CaseInsensitiveStringMap(withSessionDiscovery(options.asCaseSensitiveMap()));
    }

    /**
     * {@code options} with the reading application's task slots ({@code taskSlots}) where they lack them: the Python
     * source plans a read while written to them, and its planning worker cannot ask the session (the session's own
     * {@code taskSlots} setting, else its default parallelism).
     */
    static CaseInsensitiveStringMap withTaskSlots(CaseInsensitiveStringMap options) {
        if (options.containsKey(Contract.Option.TASK_SLOTS)) {
            return options;
        }
        Map<String, String> out = new HashMap<>(options.asCaseSensitiveMap());
        out.put(Contract.Option.TASK_SLOTS, String.valueOf(TaskSlots.of(null)));
        return new CaseInsensitiveStringMap(out);
    }

    /** The Python source's table to read: its schema is the exchange's, as the Python source describes it. */
    static Table forRead(CaseInsensitiveStringMap options) {
        PythonDataSourceV2 provider = provider();
        CaseInsensitiveStringMap found = withTaskSlots(withSessionDiscovery(options));
        return new Finding(provider.getTable(provider.inferSchema(found), new Transform[0],
                found.asCaseSensitiveMap()));
    }

    /**
     * A Python table whose scans and writes get the session's discovery settings with their options (Spark passes
     * the Python source the options of the scan or write, not the table's).
     */
    static final class Finding implements SupportsRead, SupportsWrite {
        private final Table python;

        Finding(Table python) {
            this.python = python;
        }

        @Override
        public String name() {
            return python.name();
        }

        @Override
        public StructType schema() {
            return python.schema();
        }

        @Override
        public Map<String, String> properties() {
            return python.properties();
        }

        @Override
        public Set<TableCapability> capabilities() {
            return python.capabilities();
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return ((SupportsRead) python).newScanBuilder(withTaskSlots(withSessionDiscovery(options)));
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return ((SupportsWrite) python).newWriteBuilder(withSessionDiscovery(info));
        }
    }

    /** {@code info} with the session's discovery settings among its options (the Python writer reads them there). */
    static LogicalWriteInfo withSessionDiscovery(LogicalWriteInfo info) {
        CaseInsensitiveStringMap options = withSessionDiscovery(info.options());
        return new LogicalWriteInfo() {
            @Override
            public CaseInsensitiveStringMap options() {
                return options;
            }

            @Override
            public String queryId() {
                return info.queryId();
            }

            @Override
            public StructType schema() {
                return info.schema();
            }

            @Override
            public java.util.Optional<StructType> rowIdSchema() {
                return info.rowIdSchema();
            }

            @Override
            public java.util.Optional<StructType> metadataSchema() {
                return info.metadataSchema();
            }
        };
    }

    /** The Python source's table to write: the query's schema reaches it with the write (Spark passes it then). */
    static Table forWrite(CaseInsensitiveStringMap options) {
        return new AnySchemaWrite(provider().getTable(new StructType(), new Transform[0],
                withSessionDiscovery(options.asCaseSensitiveMap())));
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
            return ((SupportsWrite) python).newWriteBuilder(withSessionDiscovery(info));
        }
    }
}
