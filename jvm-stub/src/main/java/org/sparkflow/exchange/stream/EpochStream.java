package org.sparkflow.exchange.stream;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.read.SubpartitionInput;

/**
 * A reader query's micro-batches of a stream, in the JVM, with the Python source's behaviour: an offset is the last
 * epoch read; a new consumer group starts at {@code startingEpochs}; a trigger reads whole epochs up to
 * {@code maxEpochsPerTrigger} / {@code maxRowsPerTrigger} / {@code maxBytesPerTrigger} (at least one); an idle
 * trigger waits on the service up to {@code stream.pollWait} for the next commit (woken by it, no polling); each
 * batch's end is committed as the group's position, which releases what every group has read. Partition i of a
 * batch reads subpartition i of every producer of each epoch, epoch after epoch, from the sealed epochs' spill
 * files or services (read/SubpartitionReader).
 */
public class EpochStream implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow {
    protected final StreamSettings settings;
    protected final ReadSettings readSettings;
    protected final StreamCalls calls;
    protected final String schemaBase64;
    protected final int numSubpartitions;
    protected final int[] columns;
    protected String group;
    private Long upto; // availableNow: the newest epoch when the query started

    public EpochStream(StreamSettings settings, ReadSettings readSettings, StreamCalls calls, String schemaBase64,
                       int numSubpartitions, int[] columns) {
        this.settings = settings;
        this.readSettings = readSettings;
        this.calls = calls;
        this.schemaBase64 = schemaBase64;
        this.numSubpartitions = numSubpartitions;
        this.columns = columns;
        this.group = settings.group();
    }

    protected StreamOffset offset(long epoch) {
        return new StreamOffset(settings.stream(), epoch, group, null);
    }

    /** The offset's epoch; a query restarted from its checkpoint learns its group from it. */
    protected long position(Offset o) {
        StreamOffset s = o instanceof StreamOffset so ? so : StreamOffset.parse(settings.stream(), o.json());
        if (group == null) {
            group = s.group;
        }
        return s.epoch;
    }

    @Override
    public Offset initialOffset() {
        JsonNode joined = calls.join(group, settings.startingEpochs());
        group = joined.path("group").asText();
        return offset(joined.path("position").asLong());
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        if (settings.maxRows() != null) {
            return ReadLimit.maxRows(settings.maxRows());
        }
        if (settings.maxBytes() != null) {
            return ReadLimit.maxBytes(settings.maxBytes());
        }
        return ReadLimit.allAvailable();
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
        long after = position(start);
        Long maxRows = limit instanceof ReadMaxRows r ? Long.valueOf(r.maxRows()) : null;
        Long maxBytes = limit instanceof ReadMaxBytes b ? Long.valueOf(b.maxBytes()) : null;
        if (limit instanceof ReadAllAvailable) {
            maxRows = null;
            maxBytes = null;
        }
        JsonNode found = calls.latest(group, after, settings.maxEpochs(), maxRows, maxBytes, upto,
                upto == null ? settings.pollWaitSeconds() : 0.0);
        return offset(found.path("epoch").asLong());
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("latestOffset(start, limit) is the one Spark calls on this stream");
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        JsonNode d = calls.describe(0);
        upto = d == null ? -1L : d.path("last_committed").asLong(-1);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        long after = position(start);
        long to = position(end);
        if (to <= after) {
            return new InputPartition[0];
        }
        JsonNode plan = calls.plan(after, to);
        List<ExchangeDescription> epochs = new ArrayList<>();
        plan.path("epochs").forEach(e -> epochs.add(ExchangeDescription.parse(e.path("desc"))));
        if (epochs.isEmpty()) {
            return new InputPartition[0];
        }
        int width = plan.path("num_subpartitions").asInt(numSubpartitions);
        InputPartition[] parts = new InputPartition[width];
        for (int i = 0; i < width; i++) {
            List<SubpartitionInput> inputs = new ArrayList<>();
            for (ExchangeDescription d : epochs) {
                inputs.add(new SubpartitionInput(d.name, i, new int[] {i}, d.committed, d.epoch, -1));
            }
            parts[i] = new EpochsInput(inputs);
        }
        return parts;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new StreamReaderFactory(settings.stream(), schemaBase64, columns, readSettings);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return StreamOffset.parse(settings.stream(), json);
    }

    @Override
    public void commit(Offset end) {
        long epoch = position(end);
        if (group != null) {
            calls.commitGroup(group, epoch);
        }
    }

    @Override
    public void stop() {}

    @Override
    public String toString() {
        return "sparkflow-exchange stream " + settings.stream() + " (JVM)";
    }

    /** One read partition of a micro-batch: subpartition i of each planned epoch, in epoch order. */
    public record EpochsInput(List<SubpartitionInput> epochs) implements InputPartition {}
}
