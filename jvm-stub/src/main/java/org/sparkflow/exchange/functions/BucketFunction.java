package org.sparkflow.exchange.functions;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Murmur3HashFunction;
import org.apache.spark.sql.connector.catalog.functions.BoundFunction;
import org.apache.spark.sql.connector.catalog.functions.Reducer;
import org.apache.spark.sql.connector.catalog.functions.ReducibleFunction;
import org.apache.spark.sql.connector.catalog.functions.ScalarFunction;
import org.apache.spark.sql.connector.catalog.functions.UnboundFunction;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * {@code bucket(n, k)}: the subpartition the hash selector puts key {@code k} in, {@code pmod(murmur3(k, 42), n)},
 * computed by Spark's own hash function so it equals {@code repartition(n, k)}'s placement for every key type.
 * Spark trusts it completely when it plans a storage-partitioned join, so it must never differ from the writer.
 */
public final class BucketFunction implements UnboundFunction {
    public static final String NAME = "bucket";
    static final long SEED = 42L;

    @Override
    public String name() {
        return NAME;
    }

    @Override
    public String description() {
        return "bucket(n, k): pmod(murmur3_hash(k, 42), n), the subpartition of k in an exchange hash-partitioned on k";
    }

    @Override
    public BoundFunction bind(StructType inputType) {
        if (inputType.fields().length != 2 || !inputType.fields()[0].dataType().equals(DataTypes.IntegerType)) {
            throw new UnsupportedOperationException("bucket takes (number of buckets: int, key), got "
                    + inputType.simpleString());
        }
        return new Bound(inputType.fields()[1].dataType());
    }

    /**
     * The function bound to one key type. {@code bucket(n, k)} of two exchanges read at different widths reduce to
     * their greatest common divisor g ({@code bucket(n, k) mod g = bucket(g, k)} when g divides n), so with
     * {@code spark.sql.sources.v2.bucketing.allowCompatibleTransforms.enabled} Spark joins them without a shuffle.
     */
    public static final class Bound implements ScalarFunction<Integer>, ReducibleFunction<Integer, Integer> {
        private final DataType keyType;

        Bound(DataType keyType) {
            this.keyType = keyType;
        }

        @Override
        public DataType[] inputTypes() {
            return new DataType[] {DataTypes.IntegerType, keyType};
        }

        @Override
        public DataType resultType() {
            return DataTypes.IntegerType;
        }

        @Override
        public boolean isResultNullable() {
            return false;
        }

        @Override
        public String name() {
            return NAME;
        }

        @Override
        public String canonicalName() {
            return "sparkflow_exchange.bucket";
        }

        @Override
        public Integer produceResult(InternalRow input) {
            int n = input.getInt(0);
            Object key = input.isNullAt(1) ? null : input.get(1, keyType);
            return of(key, keyType, n);
        }

        @Override
        public Reducer<Integer, Integer> reducer(int thisNumBuckets, ReducibleFunction<?, ?> other,
                                                 int otherNumBuckets) {
            if (!(other instanceof Bound)) {
                return null;
            }
            int g = java.math.BigInteger.valueOf(thisNumBuckets).gcd(java.math.BigInteger.valueOf(otherNumBuckets))
                    .intValue();
            return g > 1 && g != thisNumBuckets ? new Modulo(g) : null;
        }

        /** The bucket of one key value (Spark's internal representation) among {@code n}. */
        public static int of(Object key, DataType type, int n) {
            int hash = (int) Murmur3HashFunction.hash(key, type, SEED);
            return ((hash % n) + n) % n;
        }
    }

    /** A bucket among n taken to its bucket among g, a divisor of n. */
    record Modulo(int g) implements Reducer<Integer, Integer> {
        @Override
        public Integer reduce(Integer bucket) {
            return bucket % g;
        }

        @Override
        public DataType resultType() {
            return DataTypes.IntegerType;
        }

        @Override
        public String displayName() {
            return "mod " + g;
        }
    }
}
