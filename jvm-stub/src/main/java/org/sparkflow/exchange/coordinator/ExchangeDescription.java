package org.sparkflow.exchange.coordinator;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.nio.channels.Channels;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.sparkflow.exchange.contract.Contract;
import java.util.OptionalLong;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;

/** An exchange as the coordinator's {@code get_exchange} describes it, reduced to what a scan plans with. */
public final class ExchangeDescription implements Serializable {
    /** One committed producer: where its finished spill file is and which host and service wrote it. */
    public record Producer(int index, String partition, String state, String spill, String hostId, long servicePid,
                           String unix, String tcp, boolean tls, List<Replica> replicas) implements Serializable {
        public Producer(int index, String partition, String state, String spill, String hostId, long servicePid,
                        String unix, String tcp, boolean tls) {
            this(index, partition, state, spill, hostId, servicePid, unix, tcp, tls, List.of());
        }
    }

    /**
     * A copy of a producer's partition (the same partition id, the same buffers in the same order) on another host's
     * service (the {@code replicas} write option): where a read goes on, at the sequence it reached, when the
     * partition's own service is lost.
     */
    public record Replica(String hostId, String unix, String tcp) implements Serializable {}

    /**
     * The coordinator's verdict on reading it (its lifecycle's, decided once for every reader): {@code sealed}, its
     * committed state reads now; {@code live}, a read planned as it is written; {@code writing}, a write is open;
     * {@code ended}, it holds nothing to read any more (a read in progress fails); when not sealed, {@code code} and
     * {@code reason} say why (the reason names the exchange).
     */
    public record Readable(boolean sealed, boolean live, boolean writing, boolean ended, String code, String reason)
            implements Serializable {}

    public final String name;
    public final long epoch; // a new one for each overwrite
    public final String state;
    public final boolean sealed;
    public final String schemaBase64;
    public final Integer numSubpartitions; // null: not known yet
    public final String partitioner;
    public final List<String> keys;
    public final boolean coalesce; // the writer gave no numSubpartitions
    public final boolean shared; // broadcast of no given width: each producer's one subpartition is every reader's
    public final String partitionType;
    public final List<Producer> committed; // in commit order
    /** Every producer attempt registered and not released (running, finished, or failed), committed or not. */
    public final List<Producer> registered;
    /** The number of committed producers at each seal (no write open any more): the states a read may end at. */
    public final List<Integer> sealEnds;
    public final Readable readable;
    public final OptionalLong rows;
    public final OptionalLong bytes;
    /** Bytes of each subpartition over every committed producer; null when the coordinator does not say. */
    public final long[] subpartitionBytes;
    /**
     * Those bytes as they would be uncompressed, what read partitions decode to and so what read layouts size by
     * ({@code subpartition_raw_bytes}); {@link #subpartitionBytes} when the coordinator does not say.
     */
    public final long[] subpartitionRawBytes;
    private transient StructType sparkSchema;

    private ExchangeDescription(JsonNode d) {
        name = d.path("name").asText();
        epoch = d.path("epoch").asLong(0);
        state = d.path("state").asText();
        sealed = d.path("sealed").asBoolean(false);
        schemaBase64 = d.path("schema").asText();
        numSubpartitions = d.path("num_subpartitions").canConvertToInt() ? d.get("num_subpartitions").asInt() : null;
        JsonNode p = d.path("partitioner");
        partitioner = p.path("name").asText("hash").toLowerCase();
        keys = new ArrayList<>();
        p.path("keys").forEach(k -> keys.add(k.asText()));
        coalesce = d.path("coalesce").asBoolean(false);
        shared = p.path("shared").asBoolean(false);
        partitionType = d.path("partition_type").asText("HYBRID");
        Map<String, JsonNode> byPartition = new HashMap<>();
        d.path("producers").forEach(x -> byPartition.put(x.path("partition").asText(), x));
        committed = new ArrayList<>();
        for (JsonNode c : d.path("committed")) {
            JsonNode x = byPartition.get(c.asText());
            if (x == null) {
                throw new IllegalStateException("exchange '" + name + "': the coordinator lists committed partition "
                        + c.asText() + " without its producer");
            }
            committed.add(producer(x));
        }
        registered = new ArrayList<>();
        d.path("producers").forEach(x -> registered.add(producer(x)));
        sealEnds = new ArrayList<>();
        d.path("seal_ends").forEach(x -> sealEnds.add(x.asInt()));
        JsonNode v = d.path("readable");
        readable = v.isObject()
                ? new Readable(v.path("sealed").asBoolean(false), v.path("live").asBoolean(false),
                        v.path("writing").asBoolean(false), v.path("ended").asBoolean(false), v.path("code").asText(""),
                        v.path("reason").asText(""))
                // a description without the coordinator's verdict is not one to read from: say so, never read blind
                : new Readable(false, false, false, true, Contract.ErrorCode.PROTOCOL, "the description of exchange '" + name
                        + "' carries no read verdict (readable): the coordinator is older than this plugin, or the "
                        + "description was not the coordinator's");
        rows = d.path("rows").canConvertToLong() ? OptionalLong.of(d.get("rows").asLong()) : OptionalLong.empty();
        bytes = sum(d.path("subpartition_bytes"));
        subpartitionBytes = perSubpartition(d.path("subpartition_bytes"), numSubpartitions);
        long[] raw = perSubpartition(d.path("subpartition_raw_bytes"), numSubpartitions);
        subpartitionRawBytes = raw != null ? raw : subpartitionBytes;
    }

    /** One count per subpartition, or null unless {@code each} is an array of exactly {@code n}. */
    private static long[] perSubpartition(JsonNode each, Integer n) {
        if (!each.isArray() || n == null || each.size() != n) {
            return null;
        }
        long[] out = new long[n];
        for (int i = 0; i < n; i++) {
            out[i] = each.get(i).asLong();
        }
        return out;
    }

    private static Producer producer(JsonNode x) {
        JsonNode loc = x.path("location");
        List<Replica> replicas = new ArrayList<>();
        for (JsonNode r : x.path("replicas")) { // "writing" (a live read) or "complete": it holds what is read
            String state = r.path("state").asText("");
            JsonNode at = r.path("location");
            if (state.equals("writing") || state.equals("complete")) {
                replicas.add(new Replica(at.path("host_id").asText(""), at.path("unix").asText(""),
                        at.path("tcp").asText("")));
            }
        }
        return new Producer(x.path("index").asInt(), x.path("partition").asText(), x.path("state").asText(),
                x.path("spill").asText(""), loc.path("host_id").asText(""), loc.path("pid").asLong(-1),
                loc.path("unix").asText(""), loc.path("tcp").asText(""), loc.path("tls").asBoolean(false),
                List.copyOf(replicas));
    }

    /**
     * The committed producers a read planned after {@code seal} seals reads (the first seal after its planning),
     * in commit order; null while that seal has not happened.
     */
    public List<Producer> readState(int seal) {
        if (seal < 0 || seal >= sealEnds.size()) {
            return null;
        }
        return committed.subList(0, Math.min(sealEnds.get(seal), committed.size()));
    }

    public static ExchangeDescription parse(JsonNode d) {
        return new ExchangeDescription(d);
    }

    private static OptionalLong sum(JsonNode values) {
        if (!values.isArray()) {
            return OptionalLong.empty();
        }
        long total = 0;
        for (JsonNode v : values) {
            total += v.asLong();
        }
        return OptionalLong.of(total);
    }

    /** The Arrow schema the writer declared (an IPC schema message, base64). */
    public Schema arrowSchema() {
        return arrowSchema(name, schemaBase64);
    }

    /** A declared schema (an IPC schema message, base64) of exchange {@code name}. */
    public static Schema arrowSchema(String name, String schemaBase64) {
        try {
            byte[] bytes = Base64.getDecoder().decode(schemaBase64);
            return MessageSerializer.deserializeSchema(
                    new ReadChannel(Channels.newChannel(new ByteArrayInputStream(bytes))));
        } catch (IOException | IllegalArgumentException e) {
            throw new IllegalStateException("exchange '" + name + "' has an unreadable schema: " + e.getMessage(), e);
        }
    }

    /** The position of column {@code name} in {@code schema}: its exact name, else its name in another case; -1. */
    public static int column(StructType schema, String name) {
        StructField[] fields = schema.fields();
        for (int i = 0; i < fields.length; i++) {
            if (fields[i].name().equals(name)) {
                return i;
            }
        }
        for (int i = 0; i < fields.length; i++) {
            if (fields[i].name().equalsIgnoreCase(name)) {
                return i;
            }
        }
        return -1;
    }

    /**
     * The column a query's reference {@code name} means, as Spark resolves it: the exact name; without
     * {@code caseSensitive}, else the one column of that name in another case (-1: none, or several).
     */
    public static int resolve(StructType schema, String name, boolean caseSensitive) {
        StructField[] fields = schema.fields();
        int found = -1;
        for (int i = 0; i < fields.length; i++) {
            if (fields[i].name().equals(name)) {
                return i;
            }
            if (!caseSensitive && fields[i].name().equalsIgnoreCase(name)) {
                found = found == -1 ? i : -2;
            }
        }
        return Math.max(found, -1);
    }

    public StructType sparkSchema() {
        if (sparkSchema == null) {
            sparkSchema = ArrowUtils.fromArrowSchema(arrowSchema());
        }
        return sparkSchema;
    }

    /**
     * A hash exchange written with its width ({@code numSubpartitions}): grouping subpartitions j, j + m, ... with m a
     * divisor of the width keeps every row of a group in {@code pmod(hash(keys), m) = j}, on any number of keys.
     */
    public boolean hashWithWidth() {
        return "hash".equals(partitioner) && !keys.isEmpty() && numSubpartitions != null && !coalesce;
    }

    /** Hash-partitioned on exactly one key with an explicit width: Spark may be told the layout. */
    public boolean bucketedOnOneKey() {
        return "hash".equals(partitioner) && keys.size() == 1 && numSubpartitions != null && !coalesce;
    }
}
