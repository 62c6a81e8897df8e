package org.sparkflow.exchange.write;

import org.apache.arrow.vector.DecimalVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.ValueVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.arrow.ArrowFieldWriter;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.execution.arrow.ArrowWriter$;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;

/**
 * A top-level decimal column written as Spark's own {@code DecimalWriter} writes it (a value that does not fit the
 * column's precision is null), but a value that fits a long goes into the 128-bit slot as that long: Spark's
 * writer makes a {@code java.math.BigDecimal} of every value first (measured: a decimal(15,2) column made a write
 * 1.8x slower than a long column). From an {@link UnsafeRow} whose column has the vector's precision and scale, the
 * value is taken as the row holds it, already fitted to that type by Spark's row writer: the unscaled long, or
 * (precision above 18) the unscaled value's big-endian bytes, with no decimal object made (a decimal(32,4) column
 * cost the JVM writer a quarter of a TPC-H producer's task time in {@code BigInteger} and {@code BigDecimal}).
 */
final class DecimalColumnWriter extends ArrowFieldWriter {
    private final DecimalVector vector;
    private final int precision;
    private final int scale;
    private final boolean rowLayout; // the rows' column is decimal(precision, scale): an UnsafeRow's value is taken as is

    DecimalColumnWriter(DecimalVector vector, DataType rowType) {
        this.vector = vector;
        this.precision = vector.getPrecision();
        this.scale = vector.getScale();
        this.rowLayout = rowType instanceof DecimalType t && t.precision() == precision && t.scale() == scale;
    }

    /**
     * Spark's ArrowWriter for {@code root}, with this writer for its decimal columns,
     * {@link FixedWidthColumnWriter}'s for its fixed-width ones and {@link VarCharColumnWriter}'s for its strings; {@code rows}: the rows' schema;
     * {@code initialRows}: the rows the vectors are first made for.
     */
    static ArrowWriter create(VectorSchemaRoot root, StructType rows, int initialRows) {
        ArrowFieldWriter[] fields = new ArrowFieldWriter[root.getFieldVectors().size()];
        for (int i = 0; i < fields.length; i++) {
            FieldVector v = root.getFieldVectors().get(i);
            v.setInitialCapacity(initialRows);
            v.allocateNew(); // as ArrowWriter.create does
            ArrowFieldWriter fixed = FixedWidthColumnWriter.of(v);
            if (fixed == null) {
                fixed = VarCharColumnWriter.of(v);
            }
            fields[i] = v instanceof DecimalVector d ? new DecimalColumnWriter(d,
                    i < rows.fields().length ? rows.fields()[i].dataType() : null)
                    : fixed != null ? fixed : ArrowWriter$.MODULE$.createFieldWriter(v);
        }
        return new ArrowWriter(root, fields);
    }

    @Override
    public ValueVector valueVector() {
        return vector;
    }

    @Override
    public void setNull() {
        vector.setNull(count());
    }

    @Override
    public void setValue(SpecializedGetters input, int ordinal) {
        if (rowLayout && input instanceof UnsafeRow row) {
            setFromRow(row, ordinal);
            return;
        }
        Decimal value = input.getDecimal(ordinal, precision, scale);
        if (!value.changePrecision(precision, scale)) {
            vector.setNull(count());
        } else {
            long unscaled;
            try {
                unscaled = value.toUnscaledLong();
            } catch (ArithmeticException beyondLong) { // only a precision above 18 holds such values
                vector.setSafe(count(), value.toJavaBigDecimal());
                return;
            }
            setLong(unscaled);
        }
    }

    /**
     * An unscaled value that fits a long, as {@code setSafe(index, long)} stores it (the long, then its sign over the
     * high 8 bytes), straight into the vector's memory ({@link FixedWidthColumnWriter#slot}).
     */
    private void setLong(long unscaled) {
        if (!FixedWidthColumnWriter.NATIVE_LITTLE_ENDIAN) {
            vector.setSafe(count(), unscaled);
            return;
        }
        long at = FixedWidthColumnWriter.slot(vector, count(), DecimalVector.TYPE_WIDTH);
        Platform.putLong(null, at, unscaled);
        Platform.putLong(null, at + 8, unscaled < 0 ? -1L : 0L);
    }

    /** The value as {@code UnsafeRowWriter} wrote it (never null here: the caller checked). */
    private void setFromRow(UnsafeRow row, int ordinal) {
        if (precision <= Decimal.MAX_LONG_DIGITS()) {
            setLong(row.getLong(ordinal));
            return;
        }
        long offsetAndSize = row.getLong(ordinal); // BigInteger.toByteArray() of the unscaled value, at most 16 bytes
        int size = (int) offsetAndSize;
        if (size > 8) {
            vector.setBigEndianSafe(count(), row.getBinary(ordinal));
            return;
        }
        Object base = row.getBaseObject();
        long at = row.getBaseOffset() + (offsetAndSize >>> 32);
        long unscaled = size == 0 ? 0 : Platform.getByte(base, at); // the first byte carries the sign
        for (int i = 1; i < size; i++) {
            unscaled = (unscaled << 8) | (Platform.getByte(base, at + i) & 0xFF);
        }
        setLong(unscaled);
    }
}
