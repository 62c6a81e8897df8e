package org.sparkflow.exchange;

import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * Starts sparkflow-exchange services with the application: the coordinator with the driver, and
 * this host's (or this executor's) exchange service with each executor. Both are attached to
 * their JVM and exit by themselves when it ends, even if it is killed. With a coordinator of the
 * operator's configured ({@code spark.sparkflow.exchange.coordinator} in spark-defaults.conf), it
 * starts none: executors use the service running on their host. Their metrics appear in
 * Spark's metrics system as this plugin's gauges (see {@link ServiceGauges}).
 *
 * <pre>
 * spark.jars     .../sparkflow-exchange-plugin.jar
 * spark.plugins  org.sparkflow.exchange.ExchangePlugin
 * </pre>
 */
public class ExchangePlugin implements SparkPlugin {
    static final long TIMEOUT_SECONDS = 60;
    static final long DETACH_TIMEOUT_SECONDS = 10;
    /** What an executor tells the driver when its launcher failed: {@code [MISSING, host, its one line]}. */
    static final String LAUNCHER_FAILED = "sparkflow-exchange launcher failed";
    /** Hosts whose executors could not start their service, and what their launcher said (driver side). */
    private static final Map<String, String> FAILED_HOSTS = new LinkedHashMap<>();
    private static final AtomicBoolean SAID_AT_FIRST_USE = new AtomicBoolean();

    /**
     * Said once per application, at the first read or write of an exchange through the jar, when executors of some
     * host could not start: which hosts, and what to run there (the driver log said it when it happened).
     */
    public static void sayFailedHostsOnce() {
        String said;
        synchronized (FAILED_HOSTS) {
            if (FAILED_HOSTS.isEmpty() || !SAID_AT_FIRST_USE.compareAndSet(false, true)) {
                return;
            }
            said = String.join("\n  ", FAILED_HOSTS.values());
        }
        System.err.println("WARN sparkflow-exchange: executors of " + FAILED_HOSTS.size() + " host(s) did not start, "
                + "so this application runs on the others only:\n  " + said);
    }

    /** The driver heard that {@code host}'s executor could not start; logged once per host. */
    static void executorFailed(String host, String line) {
        synchronized (FAILED_HOSTS) {
            if (FAILED_HOSTS.putIfAbsent(host, line) != null) {
                return;
            }
        }
        System.err.println("ERROR sparkflow-exchange: an executor on host " + host + " could not start (Spark retries "
                + "it there and logs each attempt as a lost executor; said once here): " + line);
    }

    @Override
    public DriverPlugin driverPlugin() {
        return new Driver();
    }

    @Override
    public ExecutorPlugin executorPlugin() {
        return new Executor();
    }

    static long pid() {
        return ProcessHandle.current().pid();
    }

    /** Best effort: runs the launcher's detach with a 10 s timeout; never throws. */
    static void detach(String python, Map<String, String> settings) {
        try {
            Launcher.run(python, settings == null ? new HashMap<>() : settings, DETACH_TIMEOUT_SECONDS,
                    "detach", "--jvm-pid", Long.toString(pid()));
        } catch (Throwable e) {
            System.err.println("WARN sparkflow-exchange: detach failed (the service exits by itself once this JVM"
                    + " is gone): " + e.getMessage());
        }
    }

    /**
     * sc.applicationId() when it is known. Spark initializes plugins before the task scheduler,
     * which is what assigns the id, so at DriverPlugin.init it is normally still null; then
     * spark.app.id (set when the user gave one), else the application name.
     */
    static String applicationId(SparkContext sc, SparkConf conf) {
        String id = null;
        try {
            id = sc.applicationId();
        } catch (RuntimeException e) {
            // not assigned yet
        }
        if (id == null || id.isEmpty()) {
            id = conf.get("spark.app.id", conf.get("spark.app.name", "spark"));
        }
        return id;
    }

    static final class Driver implements DriverPlugin {
        private String python;
        private Map<String, String> settings;

        @Override
        public Map<String, String> init(SparkContext sc, PluginContext ctx) {
            SparkConf conf = sc.getConf();
            python = Launcher.python(conf.get("spark.pyspark.python", ""));
            settings = Launcher.settings(conf);
            Map<String, String> reply = Launcher.run(python, settings, TIMEOUT_SECONDS, "driver",
                    "--jvm-pid", Long.toString(pid()), "--app-id", applicationId(sc, conf));
            String coordinator = reply.get("coordinator");
            String secret = reply.get("secret");
            if (coordinator == null || coordinator.isEmpty()) {
                throw new RuntimeException("sparkflow-exchange launcher gave no coordinator: " + reply);
            }
            Map<String, String> forExecutors = new HashMap<>(settings);
            forExecutors.put("coordinator", coordinator);
            // the application's own coordinator: its fresh secret; a coordinator of the operator's: none
            // (every host reads the configured secretFile)
            if (secret != null && !secret.isEmpty()) {
                forExecutors.put("secret", secret);
            }
            settings = forExecutors;
            ServiceGauges.registerDriver(ctx.metricRegistry(), reply.get("metrics"));
            return forExecutors;
        }

        @Override
        public Object receive(Object message) {
            if (message instanceof String[] m && m.length == 3 && LAUNCHER_FAILED.equals(m[0])) {
                executorFailed(m[1], m[2]);
            }
            return "";
        }

        @Override
        public void shutdown() {
            if (python != null) {
                detach(python, settings);
            }
        }
    }

    static final class Executor implements ExecutorPlugin {
        private String python;
        private Map<String, String> settings;

        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            python = Launcher.python(ctx.conf().get("spark.pyspark.python", ""));
            settings = extraConf == null ? new HashMap<>() : new HashMap<>(extraConf);
            Map<String, String> reply;
            try {
                reply = Launcher.run(python, settings, TIMEOUT_SECONDS, "executor", "--jvm-pid",
                        Long.toString(pid()), "--executor-id", ctx.executorID());
            } catch (RuntimeException e) {
                tellDriver(ctx, e);
                throw e;
            }
            ServiceGauges.registerExecutor(ctx.metricRegistry(), reply.get("metrics"));
        }

        /** This host's name (an executor's PluginContext.hostname() fails: its RPC environment has no address). */
        private static String hostName() {
            try {
                return java.net.InetAddress.getLocalHost().getHostName();
            } catch (java.io.IOException e) {
                return "(unknown: " + e.getMessage() + ")";
            }
        }

        /** Best effort: the driver logs which host could not start and why (waits for it, as this JVM ends next). */
        private static void tellDriver(PluginContext ctx, RuntimeException e) {
            String first = String.valueOf(e.getMessage()).split("\n", 2)[0];
            try {
                ctx.ask(new String[] {LAUNCHER_FAILED, hostName(), first});
            } catch (Exception other) { // the executor's stderr and the lost executor's reason still say it
                System.err.println("WARN sparkflow-exchange: the driver could not be told that this executor cannot "
                        + "start: " + other);
            }
        }

        @Override
        public void shutdown() {
            if (python != null) {
                detach(python, settings);
            }
        }
    }
}
