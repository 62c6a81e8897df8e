package org.sparkflow.exchange.stream;

import java.util.SortedMap;
import java.util.TreeMap;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.SupportsRealTimeMode;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.sparkflow.exchange.read.ReadSettings;

/**
 * The stream in Spark's Real-time Mode (Spark 4.3+; loaded by name only where Spark has the interface, so the jar
 * still loads on older Sparks). Read task i takes subpartition i of every producer of each epoch as the writer pushes
 * its buffers, epoch after epoch, the epoch being written included ({@link RealTimeReader}); its offset is per
 * subpartition: the epoch being read and the rows taken of each of its producer tasks, so a restart from the checkpoint
 * resumes exactly there. The merged offset's epoch (every epoch before the slowest subpartition's) is the consumer
 * group's position at the batch's commit.
 */
public final class RealTimeEpochStream extends EpochStream implements SupportsRealTimeMode {
    private volatile boolean realTime;

    public RealTimeEpochStream(StreamSettings settings, ReadSettings readSettings, StreamCalls calls,
                               String schemaBase64, int numSubpartitions, int[] columns) {
        super(settings, readSettings, calls, schemaBase64, numSubpartitions, columns);
    }

    @Override
    public void prepareForRealTimeMode() {
        realTime = true;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start) {
        realTime = true;
        StreamOffset s = start instanceof StreamOffset so ? so : StreamOffset.parse(settings.stream(), start.json());
        if (group == null) {
            group = s.group;
        }
        InputPartition[] parts = new InputPartition[numSubpartitions];
        for (int i = 0; i < numSubpartitions; i++) {
            StreamOffset.Position p = s.subpartitions == null ? null : s.subpartitions.get(i);
            parts[i] = new RealTimeReader.Input(settings.stream(), i,
                    p != null ? p : StreamOffset.Position.start(s.epoch + 1), schemaBase64, columns, readSettings);
        }
        return parts;
    }

    @Override
    public Offset mergeOffsets(PartitionOffset[] offsets) {
        SortedMap<Integer, StreamOffset.Position> subs = new TreeMap<>();
        long done = Long.MAX_VALUE;
        for (PartitionOffset o : offsets) {
            RealTimeReader.SubpartitionOffset s = (RealTimeReader.SubpartitionOffset) o;
            subs.put(s.index(), s.position());
            done = Math.min(done, s.position().epoch() - 1);
        }
        return new StreamOffset(settings.stream(), done == Long.MAX_VALUE ? -1 : done, group, subs);
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
        return realTime ? start : super.latestOffset(start, limit);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new Factory(super.createReaderFactory());
    }

    /** Rows for Real-time Mode's read tasks, columnar batches for micro-batches. */
    private static final class Factory implements PartitionReaderFactory {
        private final PartitionReaderFactory batches;

        Factory(PartitionReaderFactory batches) {
            this.batches = batches;
        }

        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return !(partition instanceof RealTimeReader.Input);
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new RealTimeReader((RealTimeReader.Input) partition);
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return batches.createColumnarReader(partition);
        }
    }
}
