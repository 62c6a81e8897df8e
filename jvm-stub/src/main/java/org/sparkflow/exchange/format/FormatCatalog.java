package org.sparkflow.exchange.format;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableContext;
import org.apache.spark.sql.connector.catalog.TableWritePrivilege;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.Launcher;
import org.sparkflow.exchange.catalog.ExchangeCatalog;
import org.sparkflow.exchange.catalog.ExchangeTable;
import org.sparkflow.exchange.catalog.NewExchangeTable;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.errors.ExchangeNotFound;
import org.sparkflow.exchange.stream.StreamSettings;
import org.sparkflow.exchange.stream.StreamSink;
import org.sparkflow.exchange.stream.StreamTable;
import org.sparkflow.exchange.write.ExchangeWriteBuilder;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * The exchange catalog as {@code format("pipelined")} uses it: Spark hands it the read's or write's options, and
 * it answers with the JVM path's table where that applies ({@link Route}), else with the Python data source's.
 * A read reads partition i from subpartition i, as the Python reader does (of an exchange being written, as it
 * goes), and reports the partitioning ({@code readPartitions} overrides the width). {@code spark.sparkflow.exchange.jvmFormat=false}
 * (session setting) sends everything to the Python source.
 */
public final class FormatCatalog extends ExchangeCatalog {
    private static final org.slf4j.Logger LOG = org.slf4j.LoggerFactory.getLogger(FormatCatalog.class);
    static final String ENABLED_KEY = Contract.Option.PREFIX + Contract.Option.JVM_FORMAT;
    static final String DECLARE_TIMEOUT = Contract.Option.DECLARE_TIMEOUT;

    /**
     * The options of the read or write being planned on this thread: Spark asks the format for the catalog and the
     * identifier, then loads the table from the catalog on the same thread, and a read's load does not pass the
     * options on, so they wait here for it.
     */
    private static final ThreadLocal<CaseInsensitiveStringMap> PENDING = new ThreadLocal<>();

    /** The options of the read or write of {@code format("pipelined")} this thread is planning, for its load. */
    static void expectOptions(CaseInsensitiveStringMap options) {
        PENDING.set(options);
    }

    /**
     * The options of the read or write of {@code exchange} this thread is planning (once), or null: options left by
     * a planning that never reached the catalog are never taken for another exchange.
     */
    private static CaseInsensitiveStringMap takeOptions(String exchange) {
        CaseInsensitiveStringMap options = PENDING.get();
        PENDING.remove();
        return options != null && exchange.equals(options.get(Contract.Option.EXCHANGE)) ? options : null;
    }

    private static boolean enabled() {
        return !"false".equalsIgnoreCase(SQLConf.get().getConfString(ENABLED_KEY, "true").trim());
    }

    @Override
    public Table loadTable(Identifier ident, TableContext context, CaseInsensitiveStringMap options)
            throws NoSuchTableException {
        boolean write = context != null && !context.writePrivileges().isEmpty();
        boolean overwrite = write && context.writePrivileges().contains(TableWritePrivilege.DELETE);
        CaseInsensitiveStringMap pending = takeOptions(ident.name());
        if (options == null || options.isEmpty()) {
            options = pending != null ? pending : new CaseInsensitiveStringMap(Map.of(Contract.Option.EXCHANGE, ident.name()));
        }
        long started = System.nanoTime();
        long deadline = write ? 0 : started + declareTimeoutNanos(options);
        Table jvm = enabled() && Route.pythonOnly(options, write) == null
                ? jvmTable(ident.name(), write, overwrite, deadline, started) : null;
        if (jvm != null) {
            return jvm;
        }
        if (!write && System.nanoTime() >= deadline && deadline > started) { // waited for a service
            Map<String, String> now = new HashMap<>(options.asCaseSensitiveMap()); // here: the Python source's error
            now.keySet().removeIf(k -> k.equalsIgnoreCase(DECLARE_TIMEOUT));
            now.put(DECLARE_TIMEOUT, "0");
            options = new CaseInsensitiveStringMap(now);
        }
        return write ? PythonSource.forWrite(options) : PythonSource.forRead(options);
    }

    /**
     * The JVM source's table of a stream read ({@code readStream.format("pipelined")}), or null when the Python
     * source is to serve it; why is logged. {@code notDeclared} is told when no writer query declared the stream
     * within declareTimeout (the Python source then answers at once, in its words).
     */
    Table streamRead(CaseInsensitiveStringMap options, boolean[] notDeclared) {
        String exchange = options.get(Contract.Option.EXCHANGE);
        String why = !enabled() ? ENABLED_KEY + "=false" : Route.streamPythonOnly(options);
        if (why != null) {
            return python(exchange, why);
        }
        StreamSettings stream = StreamSettings.of(exchange, options.asCaseSensitiveMap());
        long deadline = System.nanoTime() + (long) (stream.declareTimeoutSeconds() * 1e9);
        Endpoint found;
        try {
            found = untilFound(deadline);
        } catch (RuntimeException e) {
            return python(exchange, "no exchange service found (" + e.getMessage() + ")");
        }
        CoordinatorClient coordinator = new CoordinatorClient(found);
        com.fasterxml.jackson.databind.JsonNode desc;
        try {
            desc = StreamTable.describe(coordinator, stream);
        } catch (RuntimeException e) {
            return python(exchange, e.getMessage());
        }
        why = StreamTable.unreadable(desc);
        if (why != null) {
            notDeclared[0] = desc == null;
            return python(exchange, why);
        }
        LOG.info("stream {}: read by the JVM stream source", exchange);
        return StreamTable.of(stream, readSettings(found).readingWhileWritten(), coordinator, desc);
    }

    /**
     * The JVM stream sink for a {@code writeStream.format("pipelined")} whose options it serves (a width given,
     * hash or rebalance), or null when the Python sink is to serve it; why is logged.
     */
    Table streamWrite(Map<String, String> options) {
        String exchange = new CaseInsensitiveStringMap(options).get(Contract.Option.EXCHANGE);
        String why = !enabled() ? ENABLED_KEY + "=false" : StreamSink.unsupported(options, Route.WRITE_OPTIONS);
        if (why == null) {
            try {
                endpointStartingEmbedded(true);
            } catch (RuntimeException e) {
                why = "no exchange service found (" + e.getMessage() + ")";
            }
        }
        if (why != null) {
            LOG.info("stream {}: written by the Python data source ({})", exchange, why);
            return null;
        }
        LOG.info("stream {}: written by the JVM stream sink", exchange);
        return new StreamSink(exchange, options, settings());
    }

    private static Table python(String exchange, String why) {
        LOG.info("stream {}: read by the Python data source ({})", exchange, why);
        return null;
    }

    /** How long a read waits for its exchange to be declared: the option, else the session's setting, else 60 s. */
    private static long declareTimeoutNanos(CaseInsensitiveStringMap options) {
        String value = options.get(DECLARE_TIMEOUT);
        String key = DECLARE_TIMEOUT;
        if (value == null) {
            key = Contract.Option.PREFIX + DECLARE_TIMEOUT;
            value = SQLConf.get().getConfString(key, Contract.OptionDefault.DECLARE_TIMEOUT + "s");
        }
        return WriteSettings.duration(key, value);
    }

    /**
     * The JVM path's table for this exchange, or null when the Python source is to serve it. An overwrite declares
     * the exchange anew from the write's options (as the Python writer does, nothing kept from the one it replaces);
     * an append to a committed exchange writes in its layout.
     */
    private Table jvmTable(String exchange, boolean write, boolean overwrite, long deadline, long started) {
        Endpoint found;
        try {
            found = write ? endpointStartingEmbedded(true) : untilFound(deadline);
        } catch (RuntimeException e) { // no service (a cluster without the plugin): the Python source
            return null;
        }
        CoordinatorClient coordinator = new CoordinatorClient(found);
        ExchangeDescription desc;
        try {
            desc = write ? coordinator.describeForWrite(exchange) : coordinator.describe(exchange);
            while (!write && desc == null && pause(deadline)) { // a read waits for its writer to declare it
                desc = coordinator.describe(exchange);
            }
        } catch (RuntimeException e) { // lost, or the coordinator refused: the Python source says so in its words
            return null;
        }
        if (!write && desc == null) {
            throw new ExchangeNotFound("exchange '" + exchange + "' does not exist (waited "
                    + (deadline - started) / 1_000_000_000L + " s for a writer to declare it; check the name, or raise "
                    + "declareTimeout)");
        }
        if (write && (desc == null || (overwrite && desc.sealed))) {
            return NewExchangeTable.fromWriteOptions(exchange, coordinator, settings());
        }
        if (Route.unreadable(desc, !write) == null) { // a read (of one being written too), or an append to a sealed one
            return new ExchangeTable(desc, readSettings(found).readingWhileWritten(), coordinator, settings(),
                    desc.sealed ? String.valueOf(desc.numSubpartitions) : null); // written: laid out to the slots
        }
        return null; // aborted, coalesced, forward, a write beside another: the Python source
    }

    /**
     * The coordinator; a write of a local application that finds none starts the embedded service first, as the
     * Python writer would (a read of an exchange no service holds has nothing to read).
     */
    private Endpoint endpointStartingEmbedded(boolean write) {
        try {
            return endpoint();
        } catch (IllegalStateException none) {
            SparkContext sc = SparkContext.getOrCreate();
            if (!write || !sc.isLocal() || settings().containsKey(Contract.Option.COORDINATOR)) {
                throw none;
            }
            Launcher.embeddedService(sc.getConf());
            return endpoint();
        }
    }

    /**
     * {@code mode("error")}/{@code mode("ignore")}: Spark creates the table through the catalog. The JVM writer
     * serves it when the options fit; the Python source writes with modes append and overwrite only.
     */
    @Override
    public Table createTable(Identifier ident, Column[] columns, Transform[] partitions, Map<String, String> properties)
            throws NoSuchNamespaceException {
        CaseInsensitiveStringMap options = takeOptions(ident.name()); // a create's properties lack them
        if (options == null) {
            options = new CaseInsensitiveStringMap(Map.of(Contract.Option.EXCHANGE, ident.name()));
        }
        if (!enabled() || Route.pythonOnly(options, true) != null) {
            throw new UnsupportedOperationException("format(\"pipelined\") writes " + ident.name() + " with mode "
                    + "\"overwrite\" or \"append\"; this write's options are served by the Python data source, "
                    + "which has no create mode");
        }
        endpointStartingEmbedded(true);
        return super.createTable(ident, columns, partitions, properties);
    }

    /** Whether the exchange is declared; with no service found, it is not (a create then starts one). */
    @Override
    public boolean tableExists(Identifier ident) {
        try {
            endpoint();
        } catch (IllegalStateException none) {
            return false;
        }
        return super.tableExists(ident);
    }
}
