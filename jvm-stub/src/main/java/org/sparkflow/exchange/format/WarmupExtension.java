package org.sparkflow.exchange.format;

import org.apache.spark.sql.SparkSessionExtensions;
import org.sparkflow.exchange.write.Warmup;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Named in {@code spark.sql.extensions} by {@code sparkflow_exchange.configure}: when the session starts, it starts
 * the JVM's one warm-up of the exchange's write path ({@link Warmup}) on a daemon thread, and adds nothing to the
 * session itself.
 */
public final class WarmupExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        Warmup.start();
        return BoxedUnit.UNIT;
    }
}
