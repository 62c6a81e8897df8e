package org.sparkflow.exchange.read;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SortedSet;
import java.util.TreeMap;
import java.util.TreeSet;
import org.apache.spark.sql.catalyst.expressions.Murmur3HashFunction;
import org.apache.spark.sql.connector.expressions.Literal;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.filter.Predicate;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.sparkflow.exchange.coordinator.ExchangeDescription;

/**
 * The subpartitions an equality or IN filter on every hash key can match: the writer put a row in
 * {@code pmod(murmur3_hash(keys, 42), n)}, so only the subpartitions of the filter's key values hold rows it keeps.
 * Only keys whose values hash the same whatever their spelling are pruned on (integers, strings of the default
 * collation, dates, timestamps, decimals, binary, booleans; not floating point, where -0.0 equals 0.0). Spark still
 * applies every filter to the rows read: pruning only skips subpartitions that cannot hold a match.
 */
final class KeyFilter {
    static final int MAX_COMBINATIONS = 4096;
    private final List<String> keys;
    private final StructType schema;
    private final int[] keyColumns; // each key's column in the schema, as its writer resolved it (-1: none)
    private final DataType[] keyTypes;
    private final Map<Integer, Set<Object>> values = new TreeMap<>(); // key position -> values it may equal
    private final List<Predicate> used = new ArrayList<>();

    KeyFilter(StructType schema, List<String> keys) {
        this.keys = keys;
        this.schema = schema;
        this.keyColumns = new int[keys.size()];
        this.keyTypes = new DataType[keys.size()];
        for (int i = 0; i < keys.size(); i++) {
            int at = ExchangeDescription.column(schema, keys.get(i));
            keyColumns[i] = at;
            keyTypes[i] = at < 0 ? null : schema.fields()[at].dataType();
        }
    }

    /** Take what {@code p} says about a key's values, if it is an equality or IN on one of them. */
    void offer(Predicate p) {
        String op = p.name();
        if (!(op.equals("=") || op.equals("<=>") || op.equals("IN")) || p.children().length < 2) {
            return;
        }
        int first = op.equals("IN") ? 1 : 0;
        NamedReference ref;
        List<Literal<?>> literals = new ArrayList<>();
        if (p.children()[0] instanceof NamedReference r) {
            ref = r;
            for (int i = 1; i < p.children().length; i++) {
                if (!(p.children()[i] instanceof Literal<?> l)) {
                    return;
                }
                literals.add(l);
            }
        } else if (first == 0 && p.children()[1] instanceof NamedReference r && p.children()[0] instanceof Literal<?> l) {
            ref = r;
            literals.add(l);
        } else {
            return;
        }
        int key = keyPosition(ref);
        if (key < 0 || !prunable(keyTypes[key])) {
            return;
        }
        Set<Object> found = new HashSet<>();
        for (Literal<?> l : literals) {
            if (!l.dataType().equals(keyTypes[key])) {
                return; // another type's value may hash differently: no pruning on this predicate
            }
            if (l.value() != null) {
                found.add(l.value());
            }
        }
        values.merge(key, found, (a, b) -> {
            a.retainAll(b);
            return a;
        });
        used.add(p);
    }

    private int keyPosition(NamedReference ref) {
        if (ref.fieldNames().length != 1) {
            return -1;
        }
        // the column the filter names, as Spark resolved it (spark.sql.caseSensitive): with columns k and K, a
        // filter on k is not a filter on a key K
        int column = ExchangeDescription.resolve(schema, ref.fieldNames()[0], SQLConf.get().caseSensitiveAnalysis());
        for (int i = 0; column >= 0 && i < keys.size(); i++) {
            if (keyColumns[i] == column && keyTypes[i] != null) {
                return i;
            }
        }
        return -1;
    }

    private static boolean prunable(DataType t) {
        return t instanceof IntegerType || t instanceof LongType || t instanceof ShortType || t instanceof ByteType
                || t instanceof BooleanType || t instanceof DateType || t instanceof TimestampType
                || t instanceof TimestampNTZType || t instanceof DecimalType || t instanceof BinaryType
                || t.equals(DataTypes.StringType);
    }

    /** The predicates the pruning used (Spark still evaluates them). */
    Predicate[] used() {
        return values.size() == keys.size() ? used.toArray(new Predicate[0]) : new Predicate[0];
    }

    /**
     * The subpartitions of {@code n} holding every key combination the filters allow; null when the filters do
     * not bound every key (or allow too many combinations to enumerate): then every subpartition is read.
     */
    SortedSet<Integer> subpartitions(int n) {
        if (values.size() != keys.size()) {
            return null;
        }
        long combinations = 1;
        for (Set<Object> v : values.values()) {
            combinations *= Math.max(1, v.size());
            if (v.isEmpty() || combinations > MAX_COMBINATIONS) {
                return null; // no value at all (a null literal): no pruning; Spark's filter returns nothing anyway
            }
        }
        SortedSet<Integer> out = new TreeSet<>();
        hash(0, 42, n, out);
        return out;
    }

    private void hash(int key, int seed, int n, SortedSet<Integer> out) {
        if (key == keys.size()) {
            out.add(((seed % n) + n) % n);
            return;
        }
        for (Object v : values.get(key)) {
            hash(key + 1, (int) Murmur3HashFunction.hash(v, keyTypes[key], seed), n, out);
        }
    }
}
