package org.sparkflow.exchange;

import java.util.HashMap;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import scala.Tuple2;

/**
 * Starts sparkflow-exchange services with the application: the coordinator with the driver, and
 * this host's (or this executor's) exchange service with each executor. Both are attached to
 * their JVM and exit by themselves when it ends, even if it is killed.
 *
 * <pre>
 * spark.jars     .../sparkflow-exchange-plugin.jar
 * spark.plugins  org.sparkflow.exchange.ExchangePlugin
 * </pre>
 */
public class ExchangePlugin implements SparkPlugin {
    static final long TIMEOUT_SECONDS = 60;

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

    static Iterable<Map.Entry<String, String>> entries(SparkConf conf) {
        Map<String, String> all = new HashMap<>();
        for (Tuple2<String, String> t : conf.getAll()) {
            all.put(t._1(), t._2());
        }
        return all.entrySet();
    }

    static void detach(String python) {
        try {
            Launcher.run(python, new HashMap<>(), 10, "detach", "--jvm-pid", Long.toString(pid()));
        } catch (RuntimeException e) {
            System.err.println("sparkflow-exchange: detach failed (the service exits by itself): " + e.getMessage());
        }
    }

    static final class Driver implements DriverPlugin {
        private String python;

        @Override
        public Map<String, String> init(SparkContext sc, PluginContext ctx) {
            SparkConf conf = sc.getConf();
            python = Launcher.python(conf.get("spark.pyspark.python", ""));
            Map<String, String> settings = Launcher.settings(entries(conf));
            // the application id is not assigned yet when driver plugins start; the app name identifies it in logs
            String app = conf.get("spark.app.id", conf.get("spark.app.name", "spark"));
            String line = Launcher.run(python, settings, TIMEOUT_SECONDS, "driver", "--jvm-pid", Long.toString(pid()),
                    "--app-id", app);
            String coordinator = Json.field(line, "coordinator");
            String secret = Json.field(line, "secret");
            if (coordinator == null || secret == null) {
                throw new RuntimeException("sparkflow-exchange launcher gave no coordinator/secret: " + line);
            }
            Map<String, String> forExecutors = new HashMap<>(settings);
            forExecutors.put("coordinator", coordinator);
            forExecutors.put("secret", secret);
            return forExecutors;
        }

        @Override
        public void shutdown() {
            if (python != null) {
                detach(python);
            }
        }
    }

    static final class Executor implements ExecutorPlugin {
        private String python;

        @Override
        public void init(PluginContext ctx, Map<String, String> extraConf) {
            python = Launcher.python(ctx.conf().get("spark.pyspark.python", ""));
            Launcher.run(python, extraConf, TIMEOUT_SECONDS, "executor", "--jvm-pid", Long.toString(pid()),
                    "--executor-id", ctx.executorID());
        }

        @Override
        public void shutdown() {
            if (python != null) {
                detach(python);
            }
        }
    }
}
