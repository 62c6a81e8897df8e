package org.sparkflow.exchange.write;

import java.nio.ByteOrder;
import org.apache.arrow.vector.BaseFixedWidthVector;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.DateDayVector;
import org.apache.arrow.vector.Float4Vector;
import org.apache.arrow.vector.Float8Vector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.SmallIntVector;
import org.apache.arrow.vector.TimeStampMicroTZVector;
import org.apache.arrow.vector.TimeStampMicroVector;
import org.apache.arrow.vector.TinyIntVector;
import org.apache.arrow.vector.ValueVector;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.execution.arrow.ArrowFieldWriter;
import org.apache.spark.unsafe.Platform;

/**
 * A top-level column of a fixed-width type (long, int, short, byte, double, float, date, timestamp) written as
 * Spark's own writer for its vector writes it (the same getter of the row, the same value in the same slot, a null
 * as Arrow's {@code setNull}), but the value and its validity bit are stored straight into the vector's memory once
 * the writer has made room: Arrow's {@code setSafe} checks the buffer's reference count and bounds on every access
 * (measured: a third of the JVM writer's time appending a TPC-H producer's rows went to those checks).
 */
final class FixedWidthColumnWriter extends ArrowFieldWriter {
    /** The Arrow vectors written this way; any other keeps Spark's writer. */
    enum Kind { LONG, INT, SHORT, BYTE, DOUBLE, FLOAT }

    /** Arrow's memory is little endian; on another byte order the checked writers stay. */
    static final boolean NATIVE_LITTLE_ENDIAN = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
    private final BaseFixedWidthVector vector;
    private final Kind kind;
    private final int width;

    private FixedWidthColumnWriter(BaseFixedWidthVector vector, Kind kind) {
        this.vector = vector;
        this.kind = kind;
        this.width = vector.getTypeWidth();
    }

    /** The writer of {@code vector}, or null when it is not one of the {@link Kind}s (Spark's writer then). */
    static ArrowFieldWriter of(ValueVector vector) {
        if (!NATIVE_LITTLE_ENDIAN) {
            return null;
        }
        Kind kind = vector instanceof BigIntVector || vector instanceof TimeStampMicroTZVector
                || vector instanceof TimeStampMicroVector ? Kind.LONG
                : vector instanceof IntVector || vector instanceof DateDayVector ? Kind.INT
                : vector instanceof SmallIntVector ? Kind.SHORT
                : vector instanceof TinyIntVector ? Kind.BYTE
                : vector instanceof Float8Vector ? Kind.DOUBLE
                : vector instanceof Float4Vector ? Kind.FLOAT
                : null;
        return kind == null ? null : new FixedWidthColumnWriter((BaseFixedWidthVector) vector, kind);
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
        long at = slot(vector, count(), width);
        switch (kind) {
            case LONG -> Platform.putLong(null, at, input.getLong(ordinal));
            case INT -> Platform.putInt(null, at, input.getInt(ordinal));
            case SHORT -> Platform.putShort(null, at, input.getShort(ordinal));
            case BYTE -> Platform.putByte(null, at, input.getByte(ordinal));
            case DOUBLE -> Platform.putDouble(null, at, input.getDouble(ordinal));
            default -> Platform.putFloat(null, at, input.getFloat(ordinal));
        }
    }

    /**
     * The address of value {@code index}'s slot of {@code vector} ({@code width} bytes a value), its validity bit
     * set; the vector grown first, as {@code setSafe} grows it, when the slot is beyond its capacity.
     */
    static long slot(BaseFixedWidthVector vector, int index, int width) {
        while (index >= vector.getValueCapacity()) {
            vector.reAlloc();
        }
        long validity = vector.getValidityBufferAddress() + (index >>> 3);
        Platform.putByte(null, validity, (byte) (Platform.getByte(null, validity) | (1 << (index & 7))));
        return vector.getDataBufferAddress() + (long) index * width;
    }
}
