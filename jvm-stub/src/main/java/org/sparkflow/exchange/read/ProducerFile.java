package org.sparkflow.exchange.read;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.LinkOption;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.List;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.contract.Contract;

/**
 * One producer's finished spill file, for a read partition's subpartitions: each subpartition's index entries
 * (checked by {@link SpillIndex}), its data buffers in order, and its end-of-partition counts (buffers, rows) to
 * compare with what was read. Every buffer is on disk already, so the subpartitions are read one after the other.
 */
final class ProducerFile implements ProducerSource {
    static final int END_COUNTS = Contract.Buffer.END_COUNTS_SIZE; // buffers:i64, rows:i64

    private final Producer producer;
    private final FileChannel data;
    private final int[] subpartitions;
    private final List<List<SpillIndex.Entry>> entries; // by position in subpartitions
    private int at; // the subpartition being read (its position)
    private int next; // its next entry
    private final long[] buffersStored;
    private final long[] rowsStored;
    private final long[] buffersRead;
    private final long[] rowsReadBy;
    private long rowsRead;

    ProducerFile(Producer producer, int[] subpartitions) throws IOException {
        this.producer = producer;
        this.subpartitions = subpartitions.clone();
        int k = subpartitions.length;
        buffersStored = new long[k];
        rowsStored = new long[k];
        java.util.Arrays.fill(buffersStored, -1);
        java.util.Arrays.fill(rowsStored, -1);
        buffersRead = new long[k];
        rowsReadBy = new long[k];
        Path dataPath = Paths.get(producer.spill());
        this.data = FileChannel.open(dataPath, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS);
        try {
            byte[] index = Files.readAllBytes(indexPath(producer.spill()));
            List<List<SpillIndex.Entry>> all = new java.util.ArrayList<>(k);
            for (int s : subpartitions) {
                all.add(SpillIndex.entries(index, s, data.size()));
            }
            this.entries = all;
        } catch (IOException | RuntimeException e) {
            data.close();
            throw e;
        }
    }

    /** {@code x.data} -> {@code x.index}, as {@code input_channel.index_path_of}. */
    static Path indexPath(String spill) {
        String name = spill.substring(spill.lastIndexOf('/') + 1);
        String stem = spill.endsWith(".data") ? spill.substring(0, spill.length() - 5)
                : name.contains(".") ? spill.substring(0, spill.lastIndexOf('.')) : spill;
        return Paths.get(stem + ".index");
    }

    @Override
    public Producer producer() {
        return producer;
    }

    @Override
    public int next(BufferDecoder decoder) throws IOException, BufferDecoder.CorruptBuffer {
        SpillIndex.Entry entry = nextData();
        if (entry == null) {
            return -1;
        }
        int rows = decoder.load(data, entry.offset(), entry.length());
        buffersRead[at]++;
        rowsReadBy[at] += rows;
        rowsRead += rows;
        return rows;
    }

    /** The next data buffer's entry, reading end-of-partition counts on the way; null after the last. */
    private SpillIndex.Entry nextData() throws IOException {
        while (at < subpartitions.length) {
            if (next >= entries.get(at).size()) {
                if (at + 1 >= subpartitions.length) {
                    return null;
                }
                at++;
                next = 0;
                continue;
            }
            SpillIndex.Entry e = entries.get(at).get(next++);
            if (e.kind() == SpillIndex.DATA) {
                return e;
            }
            if (e.kind() == SpillIndex.END_OF_PARTITION && e.length() == END_COUNTS) {
                ByteBuffer counts = ByteBuffer.allocate(END_COUNTS);
                while (counts.hasRemaining()) {
                    if (data.read(counts, e.offset() + counts.position()) < 0) {
                        throw new IOException("the data file ends inside the end-of-partition counts (truncated)");
                    }
                }
                buffersStored[at] = counts.getLong(0);
                rowsStored[at] = counts.getLong(8);
            }
        }
        return null;
    }

    @Override
    public long rowsRead() {
        return rowsRead;
    }

    @Override
    public String countsMismatch() {
        for (int i = 0; i < subpartitions.length; i++) {
            String mismatch = ProducerSource.mismatch(buffersRead[i], rowsReadBy[i], buffersStored[i], rowsStored[i]);
            if (mismatch != null) {
                return "subpartition " + subpartitions[i] + ": " + mismatch;
            }
        }
        return null;
    }

    @Override
    public void close() throws IOException {
        data.close();
    }
}
