package org.sparkflow.exchange.format;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.SupportsCatalogOptions;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.ExchangePlugin;
import org.sparkflow.exchange.contract.Contract;

/**
 * {@code format("pipelined")} when the plugin jar is on the classpath: batch reads and writes go through the
 * exchange catalog registered as {@value #CATALOG} ({@link FormatCatalog}), which serves them in the JVM where
 * the JVM path applies and hands the rest to the Python data source of the same name. Streaming never reaches the
 * catalog: Spark asks {@link #inferSchema} and {@link #getTable} directly; a stream read gets the JVM stream source
 * where it applies (org.sparkflow.exchange.stream), everything else the Python source.
 *
 * <p>Why a catalog: Spark resolves the {@code bucket} function of a key-grouped scan through the relation's
 * catalog, so only a read planned through a catalog keeps the exchange's partitioning.
 */
public final class PipelinedFormat implements SupportsCatalogOptions, DataSourceRegister {
    public static final String SHORT_NAME = PythonSource.NAME; // taken over where the jar is loaded
    static final String CATALOG = "pipelined";
    static final String CATALOG_KEY = "spark.sql.catalog." + CATALOG;

    @Override
    public String shortName() {
        return SHORT_NAME;
    }

    /** The catalog that plans the read or write, registered in the session at first use. */
    @Override
    public String extractCatalog(CaseInsensitiveStringMap options) {
        SQLConf conf = SQLConf.get();
        String registered = conf.getConfString(CATALOG_KEY, null);
        if (registered == null) {
            conf.setConfString(CATALOG_KEY, FormatCatalog.class.getName());
        } else if (!registered.equals(FormatCatalog.class.getName())) {
            throw new IllegalStateException(CATALOG_KEY + " is set to " + registered + ", and format(\"pipelined\") "
                    + "registers its own catalog under that name: unset it, or name that catalog otherwise");
        }
        return CATALOG;
    }

    /** The exchange named by the {@code exchange} option (empty without one: the Python source says what is missing). */
    @Override
    public Identifier extractIdentifier(CaseInsensitiveStringMap options) {
        ExchangePlugin.sayFailedHostsOnce();
        FormatCatalog.expectOptions(options); // Spark loads the table from the catalog next, on this thread
        String exchange = options.get(Contract.Option.EXCHANGE);
        return Identifier.of(new String[0], exchange == null ? "" : exchange);
    }

    // Streaming (and anything else that asks the provider itself). A stream read asks inferSchema, then getTable
    // on the same thread: the JVM stream source where it applies (FormatCatalog#streamRead), else the Python source.

    private static final ThreadLocal<Table> STREAM_PENDING = new ThreadLocal<>();

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        ExchangePlugin.sayFailedHostsOnce();
        STREAM_PENDING.remove();
        boolean[] notDeclared = {false};
        Table jvm = options.containsKey(Contract.Option.EXCHANGE) ? catalog().streamRead(options, notDeclared) : null;
        if (jvm != null) {
            STREAM_PENDING.set(jvm);
            return jvm.schema();
        }
        if (notDeclared[0]) { // waited declareTimeout already: the Python source says so at once
            java.util.Map<String, String> now = new java.util.HashMap<>(options.asCaseSensitiveMap());
            now.keySet().removeIf(k -> k.equalsIgnoreCase(FormatCatalog.DECLARE_TIMEOUT));
            now.put(FormatCatalog.DECLARE_TIMEOUT, "0");
            options = new CaseInsensitiveStringMap(now);
        }
        return PythonSource.provider().inferSchema(PythonSource.withSessionDiscovery(options));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        ExchangePlugin.sayFailedHostsOnce();
        Table jvm = STREAM_PENDING.get();
        STREAM_PENDING.remove();
        if (jvm != null && jvm.name().equals(new CaseInsensitiveStringMap(properties).get(Contract.Option.EXCHANGE)) && jvm.schema().equals(schema)) {
            return jvm;
        }
        if (jvm == null) { // no stream read was planned on this thread: a stream write, which the JVM sink may serve
            Table sink = catalog().streamWrite(properties);
            if (sink != null) {
                return sink;
            }
        }
        return new PythonSource.Finding(PythonSource.provider().getTable(schema, partitioning,
                PythonSource.withSessionDiscovery(properties)));
    }

    /** The session's format catalog (registered at first use), which finds the service as batch reads do. */
    private static FormatCatalog catalog() {
        FormatCatalog catalog = new FormatCatalog();
        catalog.initialize(CATALOG, new CaseInsensitiveStringMap(Map.of()));
        return catalog;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }
}
