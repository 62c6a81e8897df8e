package org.sparkflow.exchange.stream;

import java.io.IOException;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.sparkflow.exchange.read.ColumnarReaderFactory;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.read.SubpartitionInput;

/** A micro-batch's readers: columnar, each epoch's sealed exchange read as the batch reader reads it. */
final class StreamReaderFactory extends ColumnarReaderFactory {
    StreamReaderFactory(String stream, String schemaBase64, int[] columns, ReadSettings settings) {
        super("stream '" + stream + "'", schemaBase64, columns, settings);
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return new Epochs(((EpochStream.EpochsInput) partition).epochs());
    }

    /** Subpartition i of each epoch, one epoch's reader after the other's. */
    private final class Epochs implements PartitionReader<ColumnarBatch> {
        private final List<SubpartitionInput> epochs;
        private int next;
        private PartitionReader<ColumnarBatch> current;

        Epochs(List<SubpartitionInput> epochs) {
            this.epochs = epochs;
        }

        @Override
        public boolean next() throws IOException {
            while (true) {
                if (current == null) {
                    if (next >= epochs.size()) {
                        return false;
                    }
                    current = subpartitionReader(epochs.get(next++));
                }
                if (current.next()) {
                    return true;
                }
                current.close();
                current = null;
            }
        }

        @Override
        public ColumnarBatch get() {
            return current.get();
        }

        @Override
        public void close() throws IOException {
            if (current != null) {
                current.close();
                current = null;
            }
        }
    }
}
