package org.sparkflow.exchange.write;

import org.apache.spark.sql.connector.write.WriterCommitMessage;

/** A write task's finished partition and the rows it wrote ({@code tasks.PartitionCommit}): checked at commit. */
public record ProducerCommit(String partition, int index, long rows) implements WriterCommitMessage {}
