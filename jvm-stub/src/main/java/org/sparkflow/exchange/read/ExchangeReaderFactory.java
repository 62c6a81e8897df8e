package org.sparkflow.exchange.read;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** An exchange's readers: one {@link SubpartitionReader} per planned read partition. */
public final class ExchangeReaderFactory extends ColumnarReaderFactory {
    ExchangeReaderFactory(String exchange, String schemaBase64, int[] columns, ReadSettings settings) {
        super("exchange '" + exchange + "'", schemaBase64, columns, settings);
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return subpartitionReader((SubpartitionInput) partition);
    }
}
