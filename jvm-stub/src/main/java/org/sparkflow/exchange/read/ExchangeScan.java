package org.sparkflow.exchange.read;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.OptionalLong;
import java.util.SortedSet;
import java.util.TreeSet;
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
import org.sparkflow.exchange.coordinator.ExchangeDescription;

/**
 * A scan of a sealed exchange, or of one being written ({@link LiveProducers}): read partitions as {@link ReadLayout} groups the subpartitions (with
 * {@code readPartitions=n}, partition i reads subpartition i, as the Python reader does for an explicit width),
 * only those a filter on the hash keys can match ({@link KeyFilter}). It tells Spark the rows and bytes the
 * coordinator counted, and, for a hash exchange on one key with an explicit width n read in m partitions,
 * {@code KeyGroupedPartitioning([bucket(m, k)], m)}, so {@code groupBy(k)} and joins on {@code k} of exchanges read
 * at the same m need no shuffle.
 */
public final class ExchangeScan implements Scan, Batch, SupportsReportPartitioning, SupportsReportStatistics {
    private final ExchangeDescription desc;
    private final ReadSettings settings;
    private final StructType readSchema;
    private final int[] columns; // positions of the read columns in the exchange's schema
    private final SortedSet<Integer> kept; // the subpartitions read
    private final ReadLayout layout;

    ExchangeScan(ExchangeDescription desc, ReadSettings settings, StructType required, SortedSet<Integer> pruned,
                 String readPartitions, String taskSlots) {
        this.desc = desc;
        this.settings = settings;
        StructType full = desc.sparkSchema();
        List<StructField> fields = new ArrayList<>();
        List<Integer> positions = new ArrayList<>();
        for (int i = 0; i < full.fields().length; i++) {
            if (Arrays.asList(required.fieldNames()).contains(full.fields()[i].name())) {
                fields.add(full.fields()[i]);
                positions.add(i);
            }
        }
        this.readSchema = new StructType(fields.toArray(new StructField[0]));
        this.columns = positions.stream().mapToInt(Integer::intValue).toArray();
        checkReadable();
        SortedSet<Integer> read = pruned;
        if (read == null) {
            read = new TreeSet<>();
            for (int i = 0; i < desc.numSubpartitions; i++) {
                read.add(i);
            }
        }
        kept = read;
        // sizes of an exchange being written are those of its earlier commits only: not a basis for a layout; sized
        // by what the subpartitions decode to (a compressed exchange stores a fraction of it)
        layout = "broadcast".equals(desc.partitioner)
                ? ReadLayout.copies(desc.name, desc.numSubpartitions, readPartitions, desc.shared)
                : ReadLayout.plan(desc.name, desc.numSubpartitions, kept, desc.sealed ? desc.subpartitionRawBytes : null,
                        readPartitions, desc.hashWithWidth(), !desc.sealed, taskSlots);
    }

    /**
     * The column Spark may be told the rows are grouped by: hash on one key with an explicit width, the key a column
     * of the exchange (named as its schema spells it) among the columns read; null otherwise.
     */
    private String keyColumn() {
        if (!desc.bucketedOnOneKey()) {
            return null;
        }
        int at = ExchangeDescription.column(desc.sparkSchema(), desc.keys.get(0));
        String name = at < 0 ? null : desc.sparkSchema().fields()[at].name();
        return name != null && Arrays.asList(readSchema.fieldNames()).contains(name) ? name : null;
    }

    /** Refuse at planning what this path cannot read exactly, saying what to do instead. */
    private void checkReadable() {
        String why = unreadable(desc, settings.whileWritten());
        if (why != null) {
            throw new ExchangeReadException(why);
        }
    }

    /**
     * Why the JVM reader cannot read this exchange exactly, saying what to do instead; null when it can.
     * {@code whileWritten}: an exchange being written is read as it goes (it needs its width), else refused.
     */
    public static String unreadable(ExchangeDescription desc, boolean whileWritten) {
        String ex = "exchange '" + desc.name + "'";
        ExchangeDescription.Readable verdict = desc.readable; // the coordinator's: never re-derived here
        if (!verdict.sealed() && !(whileWritten && verdict.live())) {
            return verdict.writing() && !whileWritten ? verdict.reason() + ": the catalog reads "
                    + "sealed exchanges only; read it after its write commits (the catalog setting commitTimeout waits "
                    + "for the commit), or read it while it is written with spark.read.format(\"pipelined\")"
                    : verdict.reason();
        }
        if ("forward".equals(desc.partitioner)) {
            return ex + " was written with the forward partitioner (subpartition i is producer "
                    + "i's alone), which the catalog does not read; read it with spark.read.format(\"pipelined\")";
        }
        return null;
    }

    @Override
    public StructType readSchema() {
        return readSchema;
    }

    @Override
    public String description() {
        return "sparkflow-exchange " + desc.name + " [" + desc.partitioner
                + (desc.keys.isEmpty() ? "" : "(" + String.join(", ", desc.keys) + ")") + ", "
                + desc.numSubpartitions + " subpartitions" + (kept.size() < desc.numSubpartitions ? " (" + kept.size()
                + " read)" : "") + " in " + layout.groups() + " read partitions, " + (desc.sealed
                ? desc.committed.size() + " producers]" : "read while written" + (layout.slots() > 0 ? slotsNote() : "")
                + "]");
    }

    /**
     * What the plan says of a read while written: laid out to the task slots, or, with more read partitions than
     * slots, that the partitions beyond them start as slots free up (after the write, when the producer holds it).
     */
    private String slotsNote() {
        int slots = layout.slots();
        int read = (int) layout.members().stream().filter(g -> g.length > 0).count();
        if (read <= slots) {
            return ", laid out to " + slots + " task slots";
        }
        return ", " + read + " read partitions for " + slots + " task slots: those beyond the slots start as slots "
                + "free up, after the write commits when it takes that long";
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
        List<InputPartition> parts = new ArrayList<>();
        for (int j = 0; j < layout.groups(); j++) {
            int[] members = layout.members().get(j);
            if (members.length > 0) {
                parts.add(SubpartitionInput.planned(desc, j, members));
            }
        }
        return parts.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new ExchangeReaderFactory(desc.name, desc.schemaBase64, columns, settings);
    }

    @Override
    public Partitioning outputPartitioning() {
        int read = (int) layout.members().stream().filter(g -> g.length > 0).count();
        String key = keyColumn();
        if (key != null) {
            Expression bucket = Expressions.bucket(layout.groups(), key);
            return new KeyGroupedPartitioning(new Expression[] {bucket}, read);
        }
        return new UnknownPartitioning(read);
    }

    @Override
    public Statistics estimateStatistics() {
        if (!desc.sealed) { // being written: nothing known yet (Spark then assumes it is large)
            return new Statistics() {
                @Override
                public OptionalLong sizeInBytes() {
                    return OptionalLong.empty();
                }

                @Override
                public OptionalLong numRows() {
                    return OptionalLong.empty();
                }
            };
        }
        OptionalLong bytes = desc.bytes;
        if (desc.subpartitionBytes != null && kept.size() < desc.numSubpartitions) {
            bytes = OptionalLong.of(kept.stream().mapToLong(i -> desc.subpartitionBytes[i]).sum());
        }
        if (bytes.isPresent() && columns.length < desc.sparkSchema().fields().length) {
            // a pruned scan hands Spark fewer columns: scale by their share of the default sizes
            double all = desc.sparkSchema().defaultSize();
            double read = Math.max(1, readSchema.defaultSize());
            bytes = OptionalLong.of(Math.max(1, (long) (bytes.getAsLong() * Math.min(1.0, read / Math.max(1, all)))));
        }
        OptionalLong size = bytes;
        OptionalLong rows = kept.size() < desc.numSubpartitions ? OptionalLong.empty() : desc.rows;
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
