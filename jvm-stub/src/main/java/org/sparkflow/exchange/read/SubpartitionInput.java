package org.sparkflow.exchange.read;

import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.read.HasPartitionKey;
import org.sparkflow.exchange.coordinator.ExchangeDescription;

/**
 * One read partition: its subpartitions of every committed producer, subpartition after subpartition, each in
 * commit order; of an exchange being written ({@code liveSeal} >= 0), of the producers its first seal after
 * {@code liveSeal} seals holds, taken as they write ({@link LiveProducers}). Its key is {@code bucket(m, k)} of every row in it when the writer hashed on {@code k} into a
 * multiple of m and the partition reads the subpartitions {@code key, key + m, key + 2m, ...}.
 */
public record SubpartitionInput(String exchange, int key, int[] subpartitions,
                                List<ExchangeDescription.Producer> producers, long epoch, int liveSeal)
        implements HasPartitionKey {
    /** Read partition {@code key} of {@code desc}, planned now: its subpartitions of the producers it reads. */
    static SubpartitionInput planned(ExchangeDescription desc, int key, int[] subpartitions) {
        return new SubpartitionInput(desc.name, key, subpartitions, desc.committed, desc.epoch,
                desc.sealed ? -1 : desc.sealEnds.size());
    }

    /** Whether the exchange was being written when the read was planned. */
    public boolean live() {
        return liveSeal >= 0;
    }

    @Override
    public InternalRow partitionKey() {
        return new GenericInternalRow(new Object[] {key});
    }
}
