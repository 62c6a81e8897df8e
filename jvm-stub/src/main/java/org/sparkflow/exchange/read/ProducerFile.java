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
 * One producer's finished spill file, for one subpartition: its index entries (checked by {@link SpillIndex}), its
 * data buffers in order, and the end-of-partition counts (buffers, rows) to compare with what was read.
 */
final class ProducerFile implements ProducerSource {
    static final int END_COUNTS = Contract.Buffer.END_COUNTS_SIZE; // buffers:i64, rows:i64

    private final Producer producer;
    private final FileChannel data;
    private final List<SpillIndex.Entry> entries;
    private int next;
    private long buffersStored = -1;
    private long rowsStored = -1;
    private long buffersRead;
    private long rowsRead;

    ProducerFile(Producer producer, int subpartition) throws IOException {
        this.producer = producer;
        Path dataPath = Paths.get(producer.spill());
        this.data = FileChannel.open(dataPath, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS);
        try {
            byte[] index = Files.readAllBytes(indexPath(producer.spill()));
            this.entries = SpillIndex.entries(index, subpartition, data.size());
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
        buffersRead++;
        rowsRead += rows;
        return rows;
    }

    /** The next data buffer's entry, reading end-of-partition counts on the way; null after the last. */
    private SpillIndex.Entry nextData() throws IOException {
        while (next < entries.size()) {
            SpillIndex.Entry e = entries.get(next++);
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
                buffersStored = counts.getLong(0);
                rowsStored = counts.getLong(8);
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
        return ProducerSource.mismatch(buffersRead, rowsRead, buffersStored, rowsStored);
    }

    @Override
    public void close() throws IOException {
        data.close();
    }
}
