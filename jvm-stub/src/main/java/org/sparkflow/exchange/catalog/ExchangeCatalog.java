package org.sparkflow.exchange.catalog;

import org.sparkflow.exchange.errors.ErrorCodes;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.stream.StreamCalls;
import org.sparkflow.exchange.stream.StreamSettings;
import org.sparkflow.exchange.stream.StreamTable;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.catalyst.analysis.NoSuchFunctionException;
import org.apache.spark.sql.catalyst.analysis.NoSuchNamespaceException;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.analysis.TableAlreadyExistsException;
import org.apache.spark.sql.connector.catalog.CatalogV2Util;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.FunctionCatalog;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.StagedTable;
import org.apache.spark.sql.connector.catalog.StagingTableCatalog;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCatalog;
import org.apache.spark.sql.connector.catalog.TableChange;
import org.apache.spark.sql.connector.catalog.TableInfo;
import org.apache.spark.sql.connector.catalog.functions.UnboundFunction;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.ExchangePlugin;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.discovery.Discovery;
import org.sparkflow.exchange.discovery.Endpoint;
import org.sparkflow.exchange.discovery.RuntimeDir;
import org.sparkflow.exchange.functions.BucketFunction;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.contract.Contract.ExchangeState;
import org.sparkflow.exchange.write.WriteSettings;

/**
 * The exchanges of a coordinator as the tables of a Spark catalog, read and written by the JVM:
 * <pre>
 * spark.sql.catalog.exchange  org.sparkflow.exchange.catalog.ExchangeCatalog
 * </pre>
 * Settings: {@code spark.sql.catalog.<name>.<key>}, else {@code spark.sparkflow.exchange.<key>}, for
 * {@code coordinator}, {@code service} (a writer's service), {@code secret}, {@code secretFile}, {@code hostId}; without a coordinator the runtime
 * directory's state files name it (see {@link Discovery}). Tables live in the catalog's root namespace; the
 * function {@code bucket} is what a hash exchange on one key reports its layout with. {@code commitTimeout}
 * (catalog setting only; default 0): how long loading a table waits for its exchange to be declared and committed,
 * so a consumer application may start with its producer and read once the write commits. {@code readWhileWritten}
 * (catalog setting only; default false): an exchange being written is read as its producers write it (the wait
 * then ends at its declaration), as {@code format("pipelined")} reads it.
 */
public class ExchangeCatalog implements StagingTableCatalog, FunctionCatalog {
    /** The settings that find the service (the Python source behind format("pipelined") gets the non-host ones). */
    public static final String[] KEYS = {Contract.Option.COORDINATOR, Contract.Option.SERVICE, Contract.Option.SECRET, Contract.Option.SECRET_FILE,
        Contract.Option.HOST_ID, Contract.Option.TLS_CA_FILE, Contract.Option.TLS_CERT_FILE, Contract.Option.TLS_CHECK_HOSTNAME};
    static final long POLL_MILLIS = 100;
    static final long LONGEST_WAIT_MILLIS = 20_000; // one wait at the coordinator, within a call's timeout
    private String name;
    private Map<String, String> settings;
    private long commitTimeoutNanos;
    private boolean readWhileWritten; // an exchange being written is read as it goes, not waited for
    // names createTable was asked for and nothing declared yet: writeStream.toTable creates the table, then loads it
    private final java.util.Set<String> created = java.util.concurrent.ConcurrentHashMap.newKeySet();

    @Override
    public void initialize(String name, CaseInsensitiveStringMap options) {
        this.name = name;
        this.settings = new HashMap<>();
        SparkConf conf = SparkEnv.get() != null ? SparkEnv.get().conf() : null;
        for (String key : KEYS) {
            String value = options.get(key);
            if (value == null && conf != null) {
                scala.Option<String> fromConf = conf.getOption(Contract.Option.PREFIX + key);
                value = fromConf.isDefined() ? fromConf.get() : null;
            }
            if (value != null) {
                settings.put(key, value);
            }
        }
        readWhileWritten = "true".equalsIgnoreCase(options.getOrDefault(Contract.Option.READ_WHILE_WRITTEN, String.valueOf(Contract.OptionDefault.READ_WHILE_WRITTEN)).trim());
        String wait = options.get(Contract.Option.COMMIT_TIMEOUT);
        commitTimeoutNanos = wait == null ? 0 : WriteSettings.duration("spark.sql.catalog." + name + ".commitTimeout",
                wait);
    }

    @Override
    public String name() {
        return name;
    }

    /**
     * Found at each use, not at initialisation: a local-mode coordinator may start after the session, and an
     * embedded service that restarted has a new secret (finding it reads a few small files).
     */
    protected Endpoint endpoint() {
        return Discovery.find(settings, RuntimeDir.standard());
    }

    /** The catalog's connection settings (coordinator, secret, hostId, ...), from its options or the session. */
    protected Map<String, String> settings() {
        return settings;
    }

    /** What a read task needs of this catalog: this host's identity and the secret of the coordinator found. */
    protected ReadSettings readSettings(Endpoint found) {
        return new ReadSettings(settings.getOrDefault(Contract.Option.HOST_ID, ""), found.secret(), found.coordinator(),
                readWhileWritten, found.tls());
    }

    CoordinatorClient client() {
        return new CoordinatorClient(endpoint());
    }

    private static void requireRoot(String[] namespace) throws NoSuchNamespaceException {
        if (namespace.length != 0) {
            throw new NoSuchNamespaceException(namespace);
        }
    }

    @Override
    public Identifier[] listTables(String[] namespace) throws NoSuchNamespaceException {
        requireRoot(namespace);
        List<Identifier> out = new ArrayList<>();
        for (String table : client().names()) {
            out.add(Identifier.of(new String[0], table));
        }
        return out.toArray(new Identifier[0]);
    }

    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        ExchangePlugin.sayFailedHostsOnce();
        if (ident.namespace().length != 0) {
            throw new NoSuchTableException(ident);
        }
        long deadline = System.nanoTime() + commitTimeoutNanos;
        Endpoint found = untilFound(deadline);
        ExchangeDescription desc;
        try {
            desc = untilCommitted(new CoordinatorClient(found), ident.name(), deadline);
        } catch (ServiceError e) {
            if (!ErrorCodes.NOT_A_BATCH.equals(e.code())) {
                throw e;
            }
            return streamTable(ident.name(), found); // readStream.table("<catalog>.<stream>")
        }
        if (desc == null) {
            if (created.contains(ident.name())) { // writeStream.toTable of a new stream: the JVM stream sink declares it
                return new CatalogStream(ident.name(), null, settings);
            }
            throw new NoSuchTableException(ident);
        }
        return new ExchangeTable(desc, readSettings(found), new CoordinatorClient(found), settings);
    }

    /**
     * A stream as the JVM stream source reads it and the JVM stream sink writes it; refused, saying what to use, where
     * that source cannot read it.
     */
    private Table streamTable(String name, Endpoint found) {
        CoordinatorClient coordinator = new CoordinatorClient(found);
        StreamSettings stream = StreamSettings.of(name, Map.of());
        com.fasterxml.jackson.databind.JsonNode desc = new StreamCalls(coordinator, name).describe(0);
        String why = StreamTable.unreadable(desc);
        if (why != null) {
            throw new UnsupportedOperationException("stream '" + name + "' cannot be read through the catalog ("
                    + why + "); read it with spark.readStream.format(\"pipelined\").option(\"exchange\", \"" + name
                    + "\")");
        }
        return new CatalogStream(name, StreamTable.of(stream, readSettings(found).readingWhileWritten(), coordinator,
                desc), settings);
    }

    /** Whether the exchange is declared now (a lost one is not): never waits (a create asks this before writing). */
    @Override
    public boolean tableExists(Identifier ident) {
        if (ident.namespace().length != 0) {
            return false;
        }
        try {
            return client().describeForWrite(ident.name()) != null;
        } catch (ServiceError e) {
            if (ErrorCodes.NOT_A_BATCH.equals(e.code())) {
                return true; // a stream
            }
            throw e;
        }
    }

    /**
     * The exchange's description once it is declared and committed (or aborted; with {@code readWhileWritten},
     * declared), waiting up to {@code commitTimeout}
     * for that; after it, as it is (null: not declared). A committed exchange that a new write is replacing is read
     * as committed: a read reads one committed state.
     */
    private ExchangeDescription untilCommitted(CoordinatorClient coordinator, String table, long deadline) {
        ExchangeDescription desc = coordinator.describe(table);
        while (desc == null || !(desc.sealed || ExchangeState.ABORTED.equals(desc.state) || readWhileWritten)) {
            long left = (deadline - System.nanoTime()) / 1_000_000;
            if (left <= 0) {
                break;
            }
            if (desc == null) { // not declared yet: ask again in a while
                if (!pause(deadline)) {
                    break;
                }
                desc = coordinator.describe(table);
            } else { // declared: the coordinator answers when the write commits (or aborts)
                desc = coordinator.describeWhenSealed(table, Math.min(left, LONGEST_WAIT_MILLIS));
            }
        }
        return desc;
    }

    /** The coordinator, waiting up to the deadline for one to be found (a producer may be starting it). */
    protected Endpoint untilFound(long deadline) {
        while (true) {
            try {
                return endpoint();
            } catch (IllegalStateException e) {
                if (!pause(deadline)) {
                    throw e;
                }
            }
        }
    }

    /** Wait a poll interval if the deadline allows; false when it has passed (or the thread is interrupted). */
    protected static boolean pause(long deadline) {
        if (System.nanoTime() >= deadline) {
            return false;
        }
        try {
            Thread.sleep(POLL_MILLIS);
            return true;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }

    /**
     * A new exchange for {@code writeTo(...).create()} / {@code createOrReplace()}: nothing is declared until the
     * write runs (a CREATE TABLE without a query creates no exchange). Its settings: the table properties (or
     * options), and {@code partitionedBy(bucket(n, keys...))} for a hash on the keys into n.
     */
    @Override
    public Table createTable(Identifier ident, Column[] columns, Transform[] partitions, Map<String, String> properties)
            throws NoSuchNamespaceException {
        NewExchangeTable table = newTable(ident, columns, partitions, properties, false);
        created.add(ident.name());
        return table;
    }

    private NewExchangeTable newTable(Identifier ident, Column[] columns, Transform[] partitions,
                                      Map<String, String> properties, boolean replaces) throws NoSuchNamespaceException {
        ExchangePlugin.sayFailedHostsOnce();
        requireRoot(ident.namespace());
        WriteSettings write = WriteSettings.defaults().with(List.of(properties)).withPartitioning(partitions);
        return NewExchangeTable.staged(ident.name(), CatalogV2Util.v2ColumnsToStructType(columns), partitions, properties,
                write, client(), settings, replaces);
    }

    /**
     * The staged forms of create and replace (CTAS, RTAS, {@code writeTo(...).create()/replace()/createOrReplace()}):
     * Spark then never drops the exchange before writing it, so a replace whose settings or write fail leaves the
     * committed exchange readable (the write declares an overwrite that replaces it only at its commit).
     */
    @Override
    public StagedTable stageCreate(Identifier ident, Column[] columns, Transform[] partitions,
                                   Map<String, String> properties)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        if (tableExists(ident)) {
            throw new TableAlreadyExistsException(ident);
        }
        return newTable(ident, columns, partitions, properties, false);
    }

    @Override
    public StagedTable stageReplace(Identifier ident, Column[] columns, Transform[] partitions,
                                    Map<String, String> properties)
            throws NoSuchNamespaceException, NoSuchTableException {
        if (!tableExists(ident)) {
            throw new NoSuchTableException(ident);
        }
        return newTable(ident, columns, partitions, properties, true);
    }

    @Override
    public StagedTable stageCreateOrReplace(Identifier ident, Column[] columns, Transform[] partitions,
                                            Map<String, String> properties) throws NoSuchNamespaceException {
        return newTable(ident, columns, partitions, properties, true);
    }

    @Override
    public StagedTable stageCreate(Identifier ident, TableInfo info)
            throws TableAlreadyExistsException, NoSuchNamespaceException {
        return stageCreate(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    public StagedTable stageReplace(Identifier ident, TableInfo info)
            throws NoSuchNamespaceException, NoSuchTableException {
        return stageReplace(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    public StagedTable stageCreateOrReplace(Identifier ident, TableInfo info) throws NoSuchNamespaceException {
        return stageCreateOrReplace(ident, info.columns(), info.partitions(), info.properties());
    }

    @Override
    public boolean dropTable(Identifier ident) {
        boolean wasCreated = created.remove(ident.name());
        return ident.namespace().length == 0 && client().drop(ident.name()) || wasCreated;
    }

    @Override
    public Table alterTable(Identifier ident, TableChange... changes) {
        throw new UnsupportedOperationException("exchanges cannot be altered; write the exchange again instead");
    }

    @Override
    public void renameTable(Identifier from, Identifier to) {
        throw new UnsupportedOperationException("exchanges cannot be renamed; write the exchange again under the new name");
    }

    @Override
    public Identifier[] listFunctions(String[] namespace) throws NoSuchNamespaceException {
        requireRoot(namespace);
        return new Identifier[] {Identifier.of(new String[0], BucketFunction.NAME)};
    }

    @Override
    public UnboundFunction loadFunction(Identifier ident) throws NoSuchFunctionException {
        if (ident.namespace().length == 0 && BucketFunction.NAME.equals(ident.name())) {
            return new BucketFunction();
        }
        throw new NoSuchFunctionException(ident);
    }
}
