package org.sparkflow.exchange.read;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A factory of columnar readers only, of one exchange or stream ({@code what}, named in the refusal of a row reader):
 * the exchange's Arrow buffers become Spark's batches without a row-by-row step. It holds what a
 * {@link SubpartitionReader} needs besides its input: the Arrow schema, the columns read and the read's settings.
 */
public abstract class ColumnarReaderFactory implements PartitionReaderFactory {
    private final String what;
    protected final String schemaBase64;
    protected final int[] columns;
    protected final ReadSettings settings;

    protected ColumnarReaderFactory(String what, String schemaBase64, int[] columns, ReadSettings settings) {
        this.what = what;
        this.schemaBase64 = schemaBase64;
        this.columns = columns;
        this.settings = settings;
    }

    @Override
    public final boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public final PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException(what + " is read in columnar batches only");
    }

    /** A columnar reader of one planned read partition of the exchange. */
    protected final PartitionReader<ColumnarBatch> subpartitionReader(SubpartitionInput input) {
        return new SubpartitionReader(input, schemaBase64, columns, settings);
    }
}
