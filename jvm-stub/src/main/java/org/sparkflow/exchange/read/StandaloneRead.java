package org.sparkflow.exchange.read;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.sparkflow.exchange.coordinator.ExchangeDescription;

/**
 * One read partition (one subpartition, or several read at once) read by the JVM reader outside a Spark task,
 * exactly as a read task of a scan planned on
 * {@code describeJson} reads it (the committed producers of a sealed exchange, else as the producers write): for
 * tools that check the reader against the exchange, such as the randomized consistency checker
 * ({@code scripts/checker.py --jvm-readers}). Needs Spark's jars on the class path, not a SparkContext.
 */
public final class StandaloneRead {
    private static final ObjectMapper MAPPER = new ObjectMapper();

    private StandaloneRead() {}

    /**
     * The integer columns {@code columns} (positions in the exchange's schema) of every row read, as little-endian
     * int64s, row after row. Fails with {@link ExchangeReadException} as a read task would.
     */
    public static byte[] read(String describeJson, int subpartition, String coordinator, String secret,
                              String hostId, int[] columns) throws IOException {
        return read(describeJson, new int[] {subpartition}, coordinator, secret, hostId, columns);
    }

    /** As above, of a read partition of the subpartitions {@code subpartitions}, all read at once. */
    public static byte[] read(String describeJson, int[] subpartitions, String coordinator, String secret,
                              String hostId, int[] columns) throws IOException {
        ExchangeDescription desc = ExchangeDescription.parse(MAPPER.readTree(describeJson));
        String why = ExchangeScan.unreadable(desc, true);
        if (why != null) {
            throw new ExchangeReadException(why);
        }
        SubpartitionInput input = SubpartitionInput.planned(desc, subpartitions[0], subpartitions.clone());
        ReadSettings settings = new ReadSettings(hostId, secret, coordinator, true, null);
        List<byte[]> chunks = new ArrayList<>();
        int total = 0;
        try (SubpartitionReader reader = new SubpartitionReader(input, desc.schemaBase64, columns, settings)) {
            while (reader.next()) {
                ColumnarBatch batch = reader.get();
                ByteBuffer out = ByteBuffer.allocate(batch.numRows() * columns.length * 8)
                        .order(ByteOrder.LITTLE_ENDIAN);
                for (int row = 0; row < batch.numRows(); row++) {
                    for (int c = 0; c < columns.length; c++) {
                        ColumnVector v = batch.column(c);
                        DataType type = v.dataType();
                        out.putLong(type.equals(DataTypes.IntegerType) ? v.getInt(row) : v.getLong(row));
                    }
                }
                chunks.add(out.array());
                total += out.capacity();
            }
        }
        ByteBuffer all = ByteBuffer.allocate(total);
        chunks.forEach(all::put);
        return all.array();
    }
}
