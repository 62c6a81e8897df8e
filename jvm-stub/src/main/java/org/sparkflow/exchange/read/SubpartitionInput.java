package org.sparkflow.exchange.read;

import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.read.HasPartitionKey;
import org.sparkflow.exchange.catalog.ExchangeDescription;

/**
 * One read partition: its subpartitions of every committed producer, subpartition after subpartition, each in
 * commit order. Its key is {@code bucket(m, k)} of every row in it when the writer hashed on {@code k} into a
 * multiple of m and the partition reads the subpartitions {@code key, key + m, key + 2m, ...}.
 */
public record SubpartitionInput(String exchange, int key, int[] subpartitions,
                                List<ExchangeDescription.Producer> producers) implements HasPartitionKey {
    @Override
    public InternalRow partitionKey() {
        return new GenericInternalRow(new Object[] {key});
    }
}
