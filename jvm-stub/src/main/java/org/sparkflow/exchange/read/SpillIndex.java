package org.sparkflow.exchange.read;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import org.sparkflow.exchange.contract.Contract;

/**
 * A spill index file ({@code partition/spill.py}): {@code "SFXIDX01"}, then entries
 * {@code subpartition:i32 seq:i64 offset:i64 length:i32 kind:u8 flags:u8}, big endian. {@link #entries} returns one
 * subpartition's entries in sequence order after the checks the Python reader makes: numbered 0..n-1, known kinds,
 * ending with the end-of-partition entry, inside the data file.
 */
public final class SpillIndex {
    static final byte[] MAGIC = Contract.SpillIndex.MAGIC.getBytes(StandardCharsets.US_ASCII);
    static final int ENTRY = Contract.SpillIndex.ENTRY_SIZE;
    public static final int DATA = Contract.BufferKind.DATA;
    public static final int END_OF_PARTITION = Contract.BufferKind.END_OF_PARTITION;
    public static final int MARKER = Contract.BufferKind.MARKER;

    /** One buffer of the subpartition: where its bytes are in the data file and what it is. */
    public record Entry(long seq, long offset, int length, int kind, int flags) {}

    private SpillIndex() {}

    /** The entries of {@code subpartition}; an {@link IllegalStateException} saying what is wrong otherwise. */
    public static List<Entry> entries(byte[] index, int subpartition, long dataSize) {
        ByteBuffer buf = ByteBuffer.wrap(index);
        if (index.length < MAGIC.length || !ByteBuffer.wrap(index, 0, MAGIC.length).equals(ByteBuffer.wrap(MAGIC))) {
            throw new IllegalStateException("the index does not start with the index magic");
        }
        int body = index.length - MAGIC.length;
        if (body % ENTRY != 0) {
            throw new IllegalStateException(body + " bytes of entries are not a whole number of " + ENTRY
                    + "-byte entries (truncated?)");
        }
        List<Entry> out = new ArrayList<>();
        for (int pos = MAGIC.length; pos < index.length; pos += ENTRY) {
            if (buf.getInt(pos) == subpartition) {
                out.add(new Entry(buf.getLong(pos + 4), buf.getLong(pos + 12), buf.getInt(pos + 20),
                        buf.get(pos + 24) & 0xff, buf.get(pos + 25) & 0xff));
            }
        }
        out.sort(Comparator.comparingLong(Entry::seq));
        if (out.isEmpty()) {
            throw new IllegalStateException("subpartition " + subpartition + " has no entries");
        }
        for (int i = 0; i < out.size(); i++) {
            Entry e = out.get(i);
            if (e.seq() != i) {
                throw new IllegalStateException("sequence numbers are not 0.." + (out.size() - 1) + " (an entry is lost)");
            }
            if (e.kind() > MARKER) {
                throw new IllegalStateException("unknown buffer kind " + e.kind());
            }
            if (e.offset() < 0 || e.length() < 0) {
                throw new IllegalStateException("negative offset or length");
            }
            if (e.offset() + e.length() > dataSize) {
                throw new IllegalStateException("an entry reaches byte " + (e.offset() + e.length())
                        + " of a data file of " + dataSize + " bytes (truncated?)");
            }
        }
        if (out.get(out.size() - 1).kind() != END_OF_PARTITION) {
            throw new IllegalStateException("the subpartition does not end with its end-of-partition entry");
        }
        return out;
    }
}
