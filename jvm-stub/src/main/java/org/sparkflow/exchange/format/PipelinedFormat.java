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

/**
 * {@code format("pipelined")} when the plugin jar is on the classpath: batch reads and writes go through the
 * exchange catalog registered as {@value #CATALOG} ({@link FormatCatalog}), which serves them in the JVM where
 * the JVM path applies and hands the rest to the Python data source of the same name. Streaming never reaches the
 * catalog: Spark asks {@link #getTable} directly, and that is always the Python source.
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
        String exchange = options.get("exchange");
        return Identifier.of(new String[0], exchange == null ? "" : exchange);
    }

    // Streaming (and anything else that asks the provider itself): the Python data source.

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        ExchangePlugin.sayFailedHostsOnce();
        return PythonSource.provider().inferSchema(PythonSource.withSessionDiscovery(options));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        ExchangePlugin.sayFailedHostsOnce();
        return new PythonSource.Finding(PythonSource.provider().getTable(schema, partitioning,
                PythonSource.withSessionDiscovery(properties)));
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }
}
