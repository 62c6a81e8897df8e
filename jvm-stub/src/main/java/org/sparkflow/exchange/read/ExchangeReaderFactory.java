package org.sparkflow.exchange.read;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Columnar readers only: the exchange's Arrow buffers become Spark's batches without a row-by-row step. */
public final class ExchangeReaderFactory implements PartitionReaderFactory {
    private final String exchange;
    private final String schemaBase64;
    private final int[] columns;
    private final ReadSettings settings;

    ExchangeReaderFactory(String exchange, String schemaBase64, int[] columns, ReadSettings settings) {
        this.exchange = exchange;
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
        return new SubpartitionReader((SubpartitionInput) partition, schemaBase64, columns, settings);
    }

    /**
     * A columnar reader of one planned read partition, for scans outside this package (a stream's micro-batch reads
     * each epoch's sealed exchange with it).
     */
    public static PartitionReader<ColumnarBatch> columnarReader(SubpartitionInput input, String schemaBase64,
                                                                int[] columns, ReadSettings settings) {
        return new SubpartitionReader(input, schemaBase64, columns, settings);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException("exchange '" + exchange + "' is read in columnar batches only");
    }
}
