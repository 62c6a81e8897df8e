package org.sparkflow.exchange.write;

import java.io.Serializable;
import java.util.HashMap;
import java.util.List;
import org.apache.spark.sql.types.StructType;

/**
 * A declared write as every task gets it ({@code write_handle.py}'s WriteHandle): the exchange's name, epoch and
 * write id, its schema as declared (Arrow IPC, base64) and as Spark rows, its width and how rows are routed.
 * {@code discovery}: the catalog's settings, for finding this host's service in the task.
 */
public record WriteHandle(String name, long epoch, String writeId, String schemaBase64, StructType schema,
                          Integer numSubpartitions, WriteSettings settings, HashMap<String, String> discovery,
                          List<String> privateReaders)
        implements Serializable {
    /** A handle of an exchange every credential may read (what the warm-up and the planning checks use). */
    public WriteHandle(String name, long epoch, String writeId, String schemaBase64, StructType schema,
                       Integer numSubpartitions, WriteSettings settings, HashMap<String, String> discovery) {
        this(name, epoch, writeId, schemaBase64, schema, numSubpartitions, settings, discovery, null);
    }

    /**
     * The readers a declared exchange names when not every credential may read it (its description's
     * {@code private}): each task names them to the service holding its partition; null when it is open.
     */
    public static List<String> privateReaders(com.fasterxml.jackson.databind.JsonNode desc) {
        if (!desc.path("private").asBoolean(false)) {
            return null;
        }
        List<String> out = new java.util.ArrayList<>();
        desc.path("readers").forEach(r -> out.add(r.asText()));
        return List.copyOf(out);
    }

    /** Subpartitions this producer's partition holds: one of its own (forward), n (hash, rebalance, broadcast). */
    int registeredSubpartitions() {
        if ("forward".equals(settings.partitioner())) {
            return 1;
        }
        return numSubpartitions == null ? 1 : numSubpartitions;
    }
}
