package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.Serializable;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A reader query's offset, as the Python source writes it to the checkpoint: {@code {"epochs": {stream: n},
 * "group": g}}, every epoch up to n read (a checkpoint of either route restarts the other). In Real-time Mode it
 * adds where each subpartition is: {@code "subpartitions": {"i": {"epoch": e, "rows": {task: rows}}}}, the
 * epoch being read and the rows taken of subpartition i of each of its producer tasks (by the task's index, the same
 * in every attempt of it and in a replay of the writer's micro-batch), and where in the attempt the task read a next
 * read goes on: {@code "buffers": {task: {"attempt": partition, "seq": s, "rows": r}}}, the buffer holding the next
 * row and the rows of that attempt before it. A read of that attempt asks its service for buffer s on; any other
 * attempt (a retry, a replay), or an offset without it, is read from its start, skipping the rows taken.
 */
public final class StreamOffset extends Offset implements Serializable {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    public final String stream;
    public final long epoch;
    public final String group;
    public final SortedMap<Integer, Position> subpartitions; // null: a micro-batch offset

    /** Subpartition i's place: epochs before {@code epoch} read, of epoch {@code epoch} these rows per producer task. */
    public record Position(long epoch, SortedMap<String, Long> rows, SortedMap<String, Resume> buffers)
            implements Serializable {
        public static Position start(long epoch) {
            return new Position(epoch, new TreeMap<>(), new TreeMap<>());
        }
    }

    /** Where a producer task's next row is: buffer {@code seq} of attempt {@code attempt}, after {@code rows} of its rows. */
    public record Resume(String attempt, long seq, long rows) implements Serializable {}

    public StreamOffset(String stream, long epoch, String group, SortedMap<Integer, Position> subpartitions) {
        this.stream = stream;
        this.epoch = epoch;
        this.group = group;
        this.subpartitions = subpartitions;
    }

    @Override
    public String json() {
        ObjectNode out = MAPPER.createObjectNode();
        out.putObject("epochs").put(stream, epoch);
        if (group == null) {
            out.putNull("group");
        } else {
            out.put("group", group);
        }
        if (subpartitions != null) {
            ObjectNode subs = out.putObject("subpartitions");
            for (Map.Entry<Integer, Position> e : subpartitions.entrySet()) {
                ObjectNode p = subs.putObject(String.valueOf(e.getKey()));
                p.put("epoch", e.getValue().epoch());
                ObjectNode rows = p.putObject("rows");
                e.getValue().rows().forEach(rows::put);
                if (!e.getValue().buffers().isEmpty()) {
                    ObjectNode buffers = p.putObject("buffers");
                    e.getValue().buffers().forEach((task, r) -> buffers.putObject(task).put("attempt", r.attempt())
                            .put("seq", r.seq()).put("rows", r.rows()));
                }
            }
        }
        return out.toString();
    }

    /** An offset of a checkpoint; fails naming the stream when it is not one of {@code stream}. */
    public static StreamOffset parse(String stream, String json) {
        JsonNode d;
        try {
            d = MAPPER.readTree(json);
        } catch (IOException e) {
            throw new IllegalStateException("the query's checkpoint holds offset " + json + ", not JSON: " + e);
        }
        JsonNode n = d == null ? null : d.path("epochs").get(stream);
        if (n == null || !n.canConvertToLong()) {
            throw new IllegalStateException("the query's checkpoint holds offset " + json + ", not one of exchange '"
                    + stream + "': was the checkpoint made by a query reading another exchange?");
        }
        String group = d.path("group").isTextual() ? d.get("group").asText() : null;
        SortedMap<Integer, Position> subs = null;
        if (d.path("subpartitions").isObject()) {
            subs = new TreeMap<>();
            for (var it = d.get("subpartitions").fields(); it.hasNext(); ) {
                var e = it.next();
                SortedMap<String, Long> rows = new TreeMap<>();
                e.getValue().path("rows").fields().forEachRemaining(r -> rows.put(r.getKey(), r.getValue().asLong()));
                SortedMap<String, Resume> buffers = new TreeMap<>();
                e.getValue().path("buffers").fields().forEachRemaining(r -> {
                    JsonNode b = r.getValue();
                    if (b.path("attempt").isTextual() && b.path("seq").canConvertToLong() && b.path("seq").asLong() >= 0
                            && b.path("rows").canConvertToLong() && b.path("rows").asLong() >= 0) {
                        buffers.put(r.getKey(), new Resume(b.get("attempt").asText(), b.get("seq").asLong(),
                                b.get("rows").asLong()));
                    } // else no place to go on from: that task is read from its start, skipping its rows taken
                });
                subs.put(Integer.parseInt(e.getKey()), new Position(e.getValue().path("epoch").asLong(), rows, buffers));
            }
        }
        return new StreamOffset(stream, n.asLong(), group, subs);
    }
}
