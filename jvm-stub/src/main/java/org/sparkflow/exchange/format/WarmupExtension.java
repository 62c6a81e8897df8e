package org.sparkflow.exchange.format;

import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.SparkSessionExtensions;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.Launcher;
import org.sparkflow.exchange.discovery.Discovery;
import org.sparkflow.exchange.discovery.RuntimeDir;
import org.sparkflow.exchange.write.Warmup;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Named in {@code spark.sql.extensions} by {@code sparkflow_exchange.configure}: when the session starts, it starts
 * the JVM's one warm-up of the exchange's write path ({@link Warmup}) and, in a local application that names no
 * coordinator and finds no service, the embedded service (then one connection to it, closed at once), each on a
 * daemon thread; it adds nothing to the session.
 * A local application's first write would otherwise start that service itself, and wait for it (a Python
 * process's start: measured 0.2 s on an idle machine, seconds on a busy one).
 */
public final class WarmupExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        Warmup.start();
        SparkContext sc = SparkContext.getOrCreate();
        SparkConf conf = sc.getConf();
        if (sc.isLocal() && !conf.contains(Contract.Option.PREFIX + Contract.Option.COORDINATOR)) {
            Thread t = new Thread(() -> startService(conf), "sparkflow-exchange-service-start");
            t.setDaemon(true);
            t.start();
        }
        return BoxedUnit.UNIT;
    }

    /**
     * The embedded service, as a local write finding none starts it ({@code FormatCatalog}), then one call to it
     * ({@link Warmup#connect}); best effort.
     */
    private static void startService(SparkConf conf) {
        try {
            Discovery.find(Map.of(), RuntimeDir.standard());
        } catch (IllegalStateException none) {
            try {
                Launcher.embeddedService(conf);
            } catch (RuntimeException ignored) { // the first write tries again, and says what went wrong
                return;
            }
        } catch (RuntimeException ignored) { // unreadable state: the first write's discovery says what is wrong
            return;
        }
        try {
            Warmup.connect(Discovery.find(Map.of(), RuntimeDir.standard()));
        } catch (RuntimeException ignored) { // no service after all: the first write says why
        }
    }
}
