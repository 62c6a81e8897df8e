package org.sparkflow.exchange.write;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.unsafe.hash.Murmur3_x86_32;
import org.sparkflow.exchange.coordinator.ExchangeDescription;
import org.sparkflow.exchange.contract.Contract;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Which of the producer's targets a row goes to ({@code writer/selectors.py}). Hash: Spark's own
 * {@code HashPartitioning(keys, n).partitionIdExpression}, {@code pmod(murmur3_hash(keys, 42), n)}, compiled once,
 * so a row lands where {@code repartition(n, keys)} puts it by construction; keys that are ints or longs are hashed
 * with Spark's {@code Murmur3_x86_32} as that expression hashes them, without projecting a row for each row (a
 * fifth of a TPC-H producer's write time went to that projection). Rebalance: round robin from the
 * producer's index. Forward and broadcast: one target, pushed to the producer's own subpartition (forward) or
 * to every subpartition at once (broadcast, with more than one).
 */
final class RowRouter {
    static final int BROADCAST = Contract.Buffer.BROADCAST_SUBPARTITION; // buffer_kinds.BROADCAST: a buffer for every subpartition
    private final boolean single;
    private final int width;
    private final int pushedAs; // single targets: the subpartition index pushed
    private final UnsafeProjection hash;
    // keys whose values are ints or longs (byte, short, int, date; long, timestamp): hashed here as Spark's
    // Murmur3Hash hashes them, with no row projected per row (null: the projection hashes)
    private final int[] keyOrdinals;
    private final KeyKind[] keyKinds;
    private int next;

    /** How a key's value is read and hashed (Spark's Murmur3Hash: hashInt of a byte, short, int, date; else hashLong). */
    enum KeyKind { BYTE, SHORT, INT, LONG }

    static final int SEED = 42; // Murmur3Hash's, as HashPartitioning uses it

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
            keyOrdinals = null;
            keyKinds = null;
            return;
        }
        width = n;
        pushedAs = 0;
        next = producerIndex % n;
        if (!"hash".equals(s.partitioner())) {
            hash = null;
            keyOrdinals = null;
            keyKinds = null;
            return;
        }
        List<Expression> keys = keyReferences(handle.schema(), s.keys());
        KeyKind[] kinds = new KeyKind[keys.size()];
        int[] ordinals = new int[keys.size()];
        boolean direct = true;
        for (int i = 0; i < kinds.length; i++) {
            BoundReference ref = (BoundReference) keys.get(i);
            ordinals[i] = ref.ordinal();
            kinds[i] = kindOf(ref.dataType());
            direct &= kinds[i] != null;
        }
        keyOrdinals = direct ? ordinals : null;
        keyKinds = direct ? kinds : null;
        hash = direct ? null : UnsafeProjection.create(new HashPartitioning(
                CollectionConverters.asScala(keys).toList(), n).partitionIdExpression());
    }

    /** How Murmur3Hash hashes a value of {@code type}, when it is an int or a long; null for any other type. */
    static KeyKind kindOf(DataType type) {
        if (type instanceof ByteType) {
            return KeyKind.BYTE;
        }
        if (type instanceof ShortType) {
            return KeyKind.SHORT;
        }
        if (type instanceof IntegerType || type instanceof DateType) {
            return KeyKind.INT;
        }
        if (type instanceof LongType || type instanceof TimestampType || type instanceof TimestampNTZType) {
            return KeyKind.LONG;
        }
        return null;
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

    /** The keys are hashed here, with no projection (ints and longs). */
    boolean direct() {
        return keyOrdinals != null;
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
        if (keyOrdinals != null) { // pmod(murmur3_hash(keys, 42), n), as the projection computes it
            int h = SEED;
            for (int i = 0; i < keyOrdinals.length; i++) {
                int o = keyOrdinals[i];
                if (!row.isNullAt(o)) { // a null key leaves the hash as it is
                    h = switch (keyKinds[i]) {
                        case BYTE -> Murmur3_x86_32.hashInt(row.getByte(o), h);
                        case SHORT -> Murmur3_x86_32.hashInt(row.getShort(o), h);
                        case INT -> Murmur3_x86_32.hashInt(row.getInt(o), h);
                        case LONG -> Murmur3_x86_32.hashLong(row.getLong(o), h);
                    };
                }
            }
            return Math.floorMod(h, width);
        }
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
