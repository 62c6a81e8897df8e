package org.sparkflow.exchange.write;

import org.apache.spark.TaskContext;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;

/** Ships the write's handle to the tasks; each task attempt gets a writer named after its attempt. */
public final class ExchangeDataWriterFactory implements DataWriterFactory {
    private final WriteHandle handle;

    ExchangeDataWriterFactory(WriteHandle handle) {
        this.handle = handle;
    }

    @Override
    public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
        TaskContext ctx = TaskContext.get();
        int attemptNumber = ctx == null ? 0 : ctx.attemptNumber();
        // exchange.attempt_id: Spark's partition, attempt number and unique task attempt id
        String attempt = partitionId + "-" + attemptNumber + "-" + taskId;
        return new ExchangeDataWriter(handle, partitionId, attempt);
    }
}
