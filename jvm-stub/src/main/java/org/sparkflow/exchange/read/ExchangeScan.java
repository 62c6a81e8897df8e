package org.sparkflow.exchange.read;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.OptionalLong;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.Statistics;
import org.apache.spark.sql.connector.read.SupportsReportPartitioning;
import org.apache.spark.sql.connector.read.SupportsReportStatistics;
import org.apache.spark.sql.connector.read.partitioning.KeyGroupedPartitioning;
import org.apache.spark.sql.connector.read.partitioning.Partitioning;
import org.apache.spark.sql.connector.read.partitioning.UnknownPartitioning;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.sparkflow.exchange.catalog.ExchangeDescription;

/**
 * A scan of a sealed exchange: one read partition per subpartition (partition i reads subpartition i, as the
 * Python reader does for an explicit width). It tells Spark the rows and bytes the coordinator counted, and, for a
 * hash exchange on one key with an explicit width, {@code KeyGroupedPartitioning([bucket(n, k)], n)}, so
 * {@code groupBy(k)} and joins on {@code k} of exchanges of the same width need no shuffle.
 */
public final class ExchangeScan implements Scan, Batch, SupportsReportPartitioning, SupportsReportStatistics {
    private final ExchangeDescription desc;
    private final ReadSettings settings;
    private final StructType readSchema;
    private final int[] columns; // positions of the read columns in the exchange's schema

    ExchangeScan(ExchangeDescription desc, ReadSettings settings, StructType required) {
        this.desc = desc;
        this.settings = settings;
        StructType full = desc.sparkSchema();
        List<StructField> kept = new ArrayList<>();
        List<Integer> positions = new ArrayList<>();
        for (int i = 0; i < full.fields().length; i++) {
            if (Arrays.asList(required.fieldNames()).contains(full.fields()[i].name())) {
                kept.add(full.fields()[i]);
                positions.add(i);
            }
        }
        this.readSchema = new StructType(kept.toArray(new StructField[0]));
        this.columns = positions.stream().mapToInt(Integer::intValue).toArray();
        checkReadable();
    }

    /** Refuse at planning what this path cannot read exactly, saying what to do instead. */
    private void checkReadable() {
        String ex = "exchange '" + desc.name + "'";
        if ("aborted".equals(desc.state)) {
            throw new ExchangeReadException(ex + " was aborted: its write failed, it holds no rows to read");
        }
        if (!desc.sealed) {
            throw new ExchangeReadException(ex + " is still being written (state " + desc.state + "): the catalog reads "
                    + "sealed exchanges only; read it after its write commits, or read it while it is written with "
                    + "spark.read.format(\"pipelined\")");
        }
        if (desc.numSubpartitions == null) {
            throw new ExchangeReadException(ex + " does not know its number of subpartitions");
        }
        for (ExchangeDescription.Producer p : desc.committed) {
            if (!"finished".equals(p.state())) {
                throw new ExchangeReadException(ex + ": committed producer " + p.index() + " (partition "
                        + p.partition() + ") is " + p.state() + ", not finished");
            }
        }
    }

    @Override
    public StructType readSchema() {
        return readSchema;
    }

    @Override
    public String description() {
        return "sparkflow-exchange " + desc.name + " [" + desc.partitioner
                + (desc.keys.isEmpty() ? "" : "(" + String.join(", ", desc.keys) + ")") + ", "
                + desc.numSubpartitions + " subpartitions, " + desc.committed.size() + " producers]";
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
        InputPartition[] parts = new InputPartition[desc.numSubpartitions];
        for (int i = 0; i < parts.length; i++) {
            parts[i] = new SubpartitionInput(desc.name, i, desc.committed);
        }
        return parts;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new ExchangeReaderFactory(desc.name, desc.schemaBase64, columns, settings);
    }

    @Override
    public Partitioning outputPartitioning() {
        if (desc.bucketedOnOneKey() && Arrays.asList(readSchema.fieldNames()).contains(desc.keys.get(0))) {
            Expression bucket = Expressions.bucket(desc.numSubpartitions, desc.keys.get(0));
            return new KeyGroupedPartitioning(new Expression[] {bucket}, desc.numSubpartitions);
        }
        return new UnknownPartitioning(desc.numSubpartitions);
    }

    @Override
    public Statistics estimateStatistics() {
        OptionalLong bytes = desc.bytes;
        if (bytes.isPresent() && columns.length < desc.sparkSchema().fields().length) {
            // a pruned scan hands Spark fewer columns: scale by their share of the default sizes
            double all = desc.sparkSchema().defaultSize();
            double read = Math.max(1, readSchema.defaultSize());
            bytes = OptionalLong.of(Math.max(1, (long) (bytes.getAsLong() * Math.min(1.0, read / Math.max(1, all)))));
        }
        OptionalLong size = bytes;
        OptionalLong rows = desc.rows;
        return new Statistics() {
            @Override
            public OptionalLong sizeInBytes() {
                return size;
            }

            @Override
            public OptionalLong numRows() {
                return rows;
            }
        };
    }
}
