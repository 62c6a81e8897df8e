package org.sparkflow.exchange.write;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.contract.Contract;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Which of the producer's targets a row goes to ({@code writer/selectors.py}). Hash: Spark's own
 * {@code HashPartitioning(keys, n).partitionIdExpression}, {@code pmod(murmur3_hash(keys, 42), n)}, compiled once,
 * so a row lands where {@code repartition(n, keys)} puts it by construction. Rebalance: round robin from the
 * producer's index. Forward and broadcast: one target, pushed to the producer's own subpartition (forward) or
 * to every subpartition at once (broadcast, with more than one).
 */
final class RowRouter {
    static final int BROADCAST = Contract.Buffer.BROADCAST_SUBPARTITION; // buffer_kinds.BROADCAST: a buffer for every subpartition
    private final boolean single;
    private final int width;
    private final int pushedAs; // single targets: the subpartition index pushed
    private final UnsafeProjection hash;
    private int next;

    RowRouter(WriteHandle handle, int producerIndex) {
        WriteSettings s = handle.settings();
        refuseCollated(handle.schema(), "");
        single = s.single();
        Integer n = handle.numSubpartitions();
        if (single) {
            if ("forward".equals(s.partitioner()) && n != null && producerIndex >= n) {
                throw new IllegalStateException("forward needs equal parallelism: producer " + producerIndex
                        + " has no subpartition among numSubpartitions=" + n + "; repartition the DataFrame to that "
                        + "many partitions or drop the numSubpartitions option");
            }
            width = 1;
            pushedAs = "broadcast".equals(s.partitioner()) && n != null && n > 1 ? BROADCAST : 0;
            hash = null;
            return;
        }
        width = n;
        pushedAs = 0;
        next = producerIndex % n;
        hash = "hash".equals(s.partitioner()) ? UnsafeProjection.create(new HashPartitioning(
                CollectionConverters.asScala(keyReferences(handle.schema(), s.keys())).toList(), n)
                .partitionIdExpression()) : null;
    }

    /**
     * A collated string anywhere in the rows (e.g. UTF8_LCASE) is refused: an exchange's schema is Arrow's, which
     * keeps no collation, so its readers would compare, filter, group and join the column as plain strings.
     */
    static void refuseCollated(DataType type, String where) {
        if (type instanceof StructType struct) {
            for (StructField field : struct.fields()) {
                refuseCollated(field.dataType(), where.isEmpty() ? field.name() : where + "." + field.name());
            }
        } else if (type instanceof ArrayType array) {
            refuseCollated(array.elementType(), where + "[]");
        } else if (type instanceof MapType map) {
            refuseCollated(map.keyType(), where + "{key}");
            refuseCollated(map.valueType(), where + "{value}");
        } else if (type instanceof StringType && !type.equals(DataTypes.StringType)) {
            throw new IllegalArgumentException("column '" + where + "' is a collated string (" + type.simpleString()
                    + "), whose collation an exchange does not keep (its readers would compare it as a plain string):"
                    + " cast it to STRING, or write lower(" + where + ") for UTF8_LCASE");
        }
    }

    private static List<Expression> keyReferences(StructType schema, List<String> keys) {
        List<Expression> refs = new ArrayList<>();
        StructField[] fields = schema.fields();
        for (String key : keys) {
            int found = ExchangeDescription.column(schema, key);
            if (found < 0) {
                throw new IllegalArgumentException("hash key '" + key + "' is not a column; available columns: "
                        + String.join(", ", schema.fieldNames()));
            }
            if (fields[found].dataType() instanceof StringType && !fields[found].dataType().equals(DataTypes.StringType)) {
                // an exchange's schema is Arrow's, which keeps no collation: its readers would hash, compare and
                // filter the key as plain strings, unlike the rows' own collation
                throw new IllegalArgumentException("hash key '" + fields[found].name() + "' is a collated string ("
                        + fields[found].dataType().simpleString() + "), whose collation an exchange does not keep: hash "
                        + "on a key of the default collation (e.g. lower(" + fields[found].name() + ") for UTF8_LCASE), "
                        + "or cast it to STRING");
            }
            refs.add(new BoundReference(found, fields[found].dataType(), fields[found].nullable()));
        }
        return refs;
    }

    /** Targets (row accumulators) of this producer. */
    int width() {
        return width;
    }

    /** The subpartition index a target's buffers are pushed to. */
    int subpartition(int target) {
        return single ? pushedAs : target;
    }

    int target(InternalRow row) {
        if (hash != null) {
            return hash.apply(row).getInt(0);
        }
        if (width == 1) {
            return 0;
        }
        int t = next;
        next = next + 1 == width ? 0 : next + 1;
        return t;
    }
}
