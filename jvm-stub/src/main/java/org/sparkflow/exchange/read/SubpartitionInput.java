package org.sparkflow.exchange.read;

import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.read.HasPartitionKey;
import org.sparkflow.exchange.catalog.ExchangeDescription;

/**
 * One read partition: subpartition {@code subpartition} of every committed producer, in commit order. Its key is
 * the subpartition itself, which is {@code bucket(n, k)} of every row in it when the writer hashed on {@code k}.
 */
public record SubpartitionInput(String exchange, int subpartition, List<ExchangeDescription.Producer> producers)
        implements HasPartitionKey {
    @Override
    public InternalRow partitionKey() {
        return new GenericInternalRow(new Object[] {subpartition});
    }
}
