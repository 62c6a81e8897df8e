package org.sparkflow.exchange.write;

import org.apache.arrow.vector.ValueVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.execution.arrow.ArrowFieldWriter;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A top-level string column written as Spark's own writer for its vector writes it (the row's UTF-8 bytes, a null
 * as Arrow's {@code setNull}), but the bytes are copied straight from the row into the vector's memory and the
 * offset and validity bit stored there once the writer has made room: Spark's writer wraps every value in a
 * {@code ByteBuffer} and Arrow's {@code setSafe} checks the buffers' reference counts and bounds on every access.
 * The vector's {@code lastSet} is kept as {@code setSafe} keeps it, so the nulls between two values get their
 * offsets as Arrow gives them ({@code fillEmpties}, and {@code setValueCount} at the buffer's end).
 */
final class VarCharColumnWriter extends ArrowFieldWriter {
    private final VarCharVector vector;

    private VarCharColumnWriter(VarCharVector vector) {
        this.vector = vector;
    }

    /** The writer of {@code vector}, or null when it is not a {@link VarCharVector} (Spark's writer then). */
    static ArrowFieldWriter of(ValueVector vector) {
        return FixedWidthColumnWriter.NATIVE_LITTLE_ENDIAN && vector instanceof VarCharVector v
                ? new VarCharColumnWriter(v) : null;
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
        UTF8String value = input.getUTF8String(ordinal);
        int index = count();
        int length = value.numBytes();
        while (index >= vector.getValueCapacity()) {
            vector.reallocValidityAndOffsetBuffers();
        }
        if (vector.getLastSet() < index - 1) {
            vector.fillEmpties(index); // the nulls since the last value end where it ends
        }
        long offsets = vector.getOffsetBufferAddress();
        int start = Platform.getInt(null, offsets + (long) index * 4);
        long end = (long) start + length;
        while (vector.getDataBuffer().capacity() < end) {
            vector.reallocDataBuffer();
        }
        Platform.copyMemory(value.getBaseObject(), value.getBaseOffset(), null, vector.getDataBufferAddress() + start,
                length);
        Platform.putInt(null, offsets + (long) (index + 1) * 4, (int) end);
        long validity = vector.getValidityBufferAddress() + (index >>> 3);
        Platform.putByte(null, validity, (byte) (Platform.getByte(null, validity) | (1 << (index & 7))));
        vector.setLastSet(index);
    }
}
