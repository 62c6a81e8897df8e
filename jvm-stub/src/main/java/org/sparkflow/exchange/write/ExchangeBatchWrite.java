package org.sparkflow.exchange.write;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.vector.ipc.WriteChannel;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.connector.write.BatchWrite;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.sparkflow.exchange.coordinator.CoordinatorClient;
import org.sparkflow.exchange.errors.ServiceError;

/**
 * The driver's side of one write ({@code exchange.declare_write}, {@code datasource.PipelinedWriter}): declared
 * with the coordinator when Spark asks for the batch write; the winning task attempts' partitions committed
 * together at the end (each task's other attempts are released by that commit), or the write aborted.
 */
public final class ExchangeBatchWrite implements BatchWrite {
    private final WriteHandle handle;
    private final CoordinatorClient coordinator;

    private ExchangeBatchWrite(WriteHandle handle, CoordinatorClient coordinator) {
        this.handle = handle;
        this.coordinator = coordinator;
    }

    /**
     * Declare the write. {@code declaredSchema}: the exchange's schema when appending (kept byte for byte: the
     * coordinator compares it), null to declare {@code schema} as Python would ({@code to_arrow_schema}, UTC).
     */
    static ExchangeBatchWrite declare(CoordinatorClient coordinator, String name, StructType schema,
                                      String declaredSchema, WriteSettings settings, boolean overwrite,
                                      Map<String, String> discovery) {
        String schemaB64 = declaredSchema != null ? declaredSchema : arrowSchemaBase64(schema);
        Map<String, Object> partitioner = new LinkedHashMap<>();
        partitioner.put("name", settings.partitioner());
        partitioner.put("keys", settings.keys());
        partitioner.put("custom", null);
        partitioner.put("shared", "broadcast".equals(settings.partitioner()) && settings.numSubpartitions() == null);
        Map<String, Object> args = new LinkedHashMap<>();
        args.put("name", name);
        args.put("schema", schemaB64);
        args.put("num_subpartitions", settings.numSubpartitions());
        args.put("partitioner", partitioner);
        args.put("partition_type", settings.partitionType());
        args.put("mode", overwrite ? "overwrite" : "append");
        args.put("coalesce", false); // the width is always given: numSubpartitions, else spark.sql.shuffle.partitions
        if (!settings.readers().isEmpty()) {
            args.put("readers", settings.readers());
        }
        JsonNode desc = coordinator.call("declare", args);
        Integer width = desc.path("num_subpartitions").canConvertToInt() ? Integer.valueOf(desc.get("num_subpartitions").asInt())
                : settings.numSubpartitions();
        WriteHandle handle = new WriteHandle(name, desc.path("epoch").asLong(), desc.path("write_id").asText(),
                desc.path("schema").asText(schemaB64), schema, width, settings, new HashMap<>(discovery),
                WriteHandle.privateReaders(desc));
        return new ExchangeBatchWrite(handle, coordinator);
    }

    /** {@code schema} as the Python writer declares it: Arrow, UTC timestamps, an IPC schema message in base64. */
    static String arrowSchemaBase64(StructType schema) {
        Schema arrow = ArrowUtils.toArrowSchema(schema, "UTC", false, false, false);
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try {
            MessageSerializer.serialize(new WriteChannel(Channels.newChannel(out)), arrow);
        } catch (IOException e) {
            throw new IllegalStateException("cannot serialise the exchange's Arrow schema: " + e, e);
        }
        return Base64.getEncoder().encodeToString(out.toByteArray());
    }

    WriteHandle handle() {
        return handle;
    }

    @Override
    public DataWriterFactory createBatchWriterFactory(PhysicalWriteInfo info) {
        return new ExchangeDataWriterFactory(handle);
    }

    @Override
    public void commit(WriterCommitMessage[] messages) {
        List<String> partitions = new ArrayList<>();
        Map<String, Long> rows = new LinkedHashMap<>();
        for (WriterCommitMessage m : messages) {
            if (m == null) {
                continue; // a task that wrote nothing for Spark to commit
            }
            ProducerCommit c = commitOf(m);
            partitions.add(c.partition());
            rows.put(c.partition(), c.rows());
        }
        coordinator.call("commit", Map.of("name", handle.name(), "epoch", handle.epoch(), "write_id", handle.writeId(),
                "partitions", partitions, "rows", rows));
    }

    /**
     * A task's commit message. One of another class loader (the jar added to a running session with {@code ADD JAR}:
     * the driver may read the tasks' results with a loader other than this class's) is read by its accessors; a
     * message of any other kind fails the commit, so a write never commits without the rows its tasks wrote.
     */
    static ProducerCommit commitOf(WriterCommitMessage m) {
        if (m instanceof ProducerCommit c) {
            return c;
        }
        if (m.getClass().getName().equals(ProducerCommit.class.getName())) {
            try {
                return new ProducerCommit((String) m.getClass().getMethod("partition").invoke(m),
                        (Integer) m.getClass().getMethod("index").invoke(m), (Long) m.getClass().getMethod("rows").invoke(m));
            } catch (ReflectiveOperationException | ClassCastException e) {
                throw new IllegalStateException("the commit of an exchange write cannot read a task's commit message "
                        + "(" + e + "); load the plugin jar when the session starts (spark.jars), not with ADD JAR", e);
            }
        }
        throw new IllegalStateException("the commit of an exchange write got a task commit message of "
                + m.getClass().getName() + ", not the exchange writer's: nothing is committed; load the plugin jar when "
                + "the session starts (spark.jars), not with ADD JAR");
    }

    @Override
    public void abort(WriterCommitMessage[] messages) {
        try {
            coordinator.call("abort", Map.of("name", handle.name(), "epoch", handle.epoch(),
                    "write_id", handle.writeId(), "reason", "the Spark write job failed"));
        } catch (ServiceError ignored) {
            // the coordinator is gone: nothing left to abort there (the Python writer ignores this too)
        }
    }
}
