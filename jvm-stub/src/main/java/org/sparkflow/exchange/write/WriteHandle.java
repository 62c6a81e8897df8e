package org.sparkflow.exchange.write;

import java.io.Serializable;
import java.util.HashMap;
import org.apache.spark.sql.types.StructType;

/**
 * A declared write as every task gets it ({@code write_handle.py}'s WriteHandle): the exchange's name, epoch and
 * write id, its schema as declared (Arrow IPC, base64) and as Spark rows, its width and how rows are routed.
 * {@code discovery}: the catalog's settings, for finding this host's service in the task.
 */
public record WriteHandle(String name, long epoch, String writeId, String schemaBase64, StructType schema,
                          Integer numSubpartitions, WriteSettings settings, HashMap<String, String> discovery)
        implements Serializable {
    /** Subpartitions this producer's partition holds: one of its own (forward), n (hash, rebalance, broadcast). */
    int registeredSubpartitions() {
        if ("forward".equals(settings.partitioner())) {
            return 1;
        }
        return numSubpartitions == null ? 1 : numSubpartitions;
    }
}
