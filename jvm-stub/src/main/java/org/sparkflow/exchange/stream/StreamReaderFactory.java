package org.sparkflow.exchange.stream;

import java.io.IOException;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.sparkflow.exchange.read.ExchangeReaderFactory;
import org.sparkflow.exchange.read.ReadSettings;
import org.sparkflow.exchange.read.SubpartitionInput;

/** A micro-batch's readers: columnar, each epoch's sealed exchange read as the batch reader reads it. */
final class StreamReaderFactory implements PartitionReaderFactory {
    private final String stream;
    private final String schemaBase64;
    private final int[] columns;
    private final ReadSettings settings;

    StreamReaderFactory(String stream, String schemaBase64, int[] columns, ReadSettings settings) {
        this.stream = stream;
        this.schemaBase64 = schemaBase64;
        this.columns = columns;
        this.settings = settings;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return new Epochs(((EpochStream.EpochsInput) partition).epochs());
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException("stream '" + stream + "' is read in columnar batches only");
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
                    current = ExchangeReaderFactory.columnarReader(epochs.get(next++), schemaBase64, columns, settings);
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
