package org.sparkflow.exchange.read;

import org.sparkflow.exchange.errors.ErrorCodes;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.channels.Channels;
import java.nio.file.Files;
import java.util.Base64;
import java.util.Map;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.DecimalVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.sparkflow.exchange.coordinator.ExchangeDescription.Producer;
import org.sparkflow.exchange.errors.ServiceError;
import org.sparkflow.exchange.wire.RpcConnection;

/**
 * Reads a read partition's subpartitions of every committed producer, producer after producer, all of the
 * partition's subpartitions of a producer at once (Flink's input gate: one channel per subpartition, buffers taken as
 * they arrive), so a read of an exchange being written keeps up with its producers instead of waiting for each
 * subpartition's end before the next: from its spill file when it is on this host and finished, else from its
 * exchange service under credit. Each buffer's checksum and each subpartition's end-of-partition counts are checked;
 * anything that is not exactly what was written fails the task with an error naming the exchange, producer and
 * subpartitions. An exchange being written when the read was planned is read as its producers write
 * ({@link LiveRead}): each attempt from its service as it goes, until the read's state is complete.
 */
final class SubpartitionReader implements PartitionReader<ColumnarBatch> {
    private final SubpartitionInput input;
    private final int[] columns;
    private final String hostId;
    private final String secret;
    private final BufferAllocator allocator;
    private final VectorSchemaRoot root;
    private final BufferDecoder decoder;
    private final LiveRead live; // null: the plan lists the producers
    private final ReadSettings settings;
    private final ServiceConnections connections = new ServiceConnections(); // kept between producers
    static final int GONE_LOOKUP_MILLIS = 2_000;
    private int producerIndex; // the next producer of the plan
    private ProducerSource current;
    private ColumnarBatch batch;

    SubpartitionReader(SubpartitionInput input, String schemaBase64, int[] columns, ReadSettings settings) {
        this.input = input;
        this.settings = settings;
        this.columns = columns;
        this.hostId = settings.hostId();
        this.secret = settings.secret();
        this.allocator = ArrowUtils.rootAllocator().newChildAllocator(
                "sparkflow-exchange " + input.exchange() + "/" + input.key(), 0, Long.MAX_VALUE);
        try {
            Schema schema = MessageSerializer.deserializeSchema(new ReadChannel(
                    Channels.newChannel(new ByteArrayInputStream(Base64.getDecoder().decode(schemaBase64)))));
            this.root = VectorSchemaRoot.create(schema, allocator);
        } catch (IOException e) {
            allocator.close();
            throw new ExchangeReadException("exchange '" + input.exchange() + "' has an unreadable schema: " + e, e);
        }
        this.decoder = new BufferDecoder(allocator, root);
        this.live = input.live() ? new LiveRead(input, settings) : null;
    }

    private String where(Producer p) {
        int[] subs = input.subpartitions();
        String which = subs.length == 1 ? "subpartition " + subs[0] : subs.length <= 8
                ? "subpartitions " + java.util.Arrays.toString(subs)
                : "subpartitions " + subs[0] + ", " + subs[1] + ", ... " + subs[subs.length - 1] + " (" + subs.length + ")";
        return "exchange '" + input.exchange() + "', producer " + p.index() + " (partition " + p.partition() + "), "
                + which;
    }

    private ExchangeReadException integrity(Producer p, String what, String detail) {
        return new ExchangeReadException(what + " data in " + where(p) + ": " + detail
                + ". Nothing wrong was returned; re-run the write to recover");
    }

    @Override
    public boolean next() throws IOException {
        try {
            return advance();
        } catch (ExchangeReadException e) {
            throw named(e);
        }
    }

    /**
     * The read's failure, saying so when the cause was a drop or an overwrite of its exchange (its partitions were
     * released under the read), as the Python reader says it; asked of the coordinator only when a read failed.
     */
    private ExchangeReadException named(ExchangeReadException e) {
        if (e.detail().startsWith(ExchangeReadException.goneHead(input.exchange()))
                || settings.coordinator() == null) {
            return e;
        }
        String how;
        try (RpcConnection conn = new RpcConnection(settings.coordinator(), settings.secret(), settings.hostId(),
                GONE_LOOKUP_MILLIS, settings.tls())) {
            long epoch = conn.call("get_exchange", Map.of("name", input.exchange())).path("epoch").asLong(-1);
            how = epoch != input.epoch() && input.epoch() != 0 ? "overwritten" : null;
        } catch (ServiceError w) {
            how = ErrorCodes.NO_EXCHANGE.equals(w.code()) ? "dropped" : null;
        } catch (RuntimeException other) {
            how = null; // the coordinator cannot say: the original error stands
        }
        if (how == null) {
            return e;
        }
        return new ExchangeReadException(ExchangeReadException.gone(input.exchange(), how) + " (what the read saw: "
                + e.getMessage() + ")", e);
    }

    private boolean advance() throws IOException {
        while (true) {
            if (current == null) {
                Producer next = nextProducer();
                if (next == null) {
                    return false;
                }
                try {
                    current = open(next);
                } catch (ExchangeReadException e) {
                    if (live != null && live.dropped(next, 0)) {
                        continue; // an attempt that failed before giving rows: the commit will not hold it
                    }
                    throw e;
                }
            }
            Producer p = current.producer();
            int rows;
            try {
                rows = current.next(decoder);
                if (rows < 0) {
                    String mismatch = current.countsMismatch();
                    if (mismatch != null) {
                        throw integrity(p, "lost", mismatch);
                    }
                    if (live != null) {
                        live.finished(p, current.rowsRead());
                    }
                    current.close();
                    current = null;
                    continue;
                }
            } catch (BufferDecoder.CorruptBuffer e) {
                throw integrity(p, "corrupt", e.getMessage());
            } catch (IOException | ServiceError e) {
                if (live != null && live.dropped(p, current.rowsRead())) {
                    current.close();
                    current = null;
                    continue; // an attempt that failed before giving rows: the commit will not hold it
                }
                String from = current instanceof ProducerFile ? "its spill file " + p.spill() : "its service";
                throw integrity(p, "lost", from + " cannot be read whole: " + e.getMessage());
            } catch (RuntimeException e) {
                if (e instanceof ExchangeReadException) {
                    throw e;
                }
                throw integrity(p, "corrupt", "a buffer that passed its checksum does not decode: " + e);
            }
            ColumnVector[] vectors = new ColumnVector[columns.length];
            for (int i = 0; i < columns.length; i++) {
                vectors[i] = new RootColumn(root.getVector(columns[i]));
            }
            batch = new ColumnarBatch(vectors, rows);
            return true;
        }
    }

    /** The next producer: the plan's, or the one the coordinator now names; null at the read's end. */
    private Producer nextProducer() {
        if (live != null) {
            return live.next();
        }
        return producerIndex < input.producers().size() ? input.producers().get(producerIndex++) : null;
    }

    /** The producer's spill file when it is on this host and finished with an index, else its service. */
    private ProducerSource open(Producer p) {
        boolean local = p.hostId().isEmpty() || p.hostId().equals(hostId);
        if (!local || p.spill().isEmpty() || !Files.exists(ProducerFile.indexPath(p.spill()))) {
            return remote(p, local);
        }
        if (p.servicePid() > 0 && !ProcessHandle.of(p.servicePid()).map(ProcessHandle::isAlive).orElse(false)) {
            if (!p.replicas().isEmpty()) {
                return remote(p, local); // its replicas' services serve it (after the dead one's socket refuses)
            }
            throw new ExchangeReadException("lost " + where(p) + ": the exchange service that held it (process "
                    + p.servicePid() + ") is gone, its spill files are no longer served; re-run the write to recover");
        }
        try {
            return new ProducerFile(p, input.subpartitions());
        } catch (IOException e) {
            throw integrity(p, "lost", "its spill file " + p.spill() + " cannot be opened: " + e);
        } catch (IllegalStateException e) {
            throw integrity(p, "corrupt", "its spill index " + ProducerFile.indexPath(p.spill()) + " is corrupt: "
                    + e.getMessage());
        }
    }

    private ProducerSource remote(Producer p, boolean local) {
        String address = local && !p.unix().isEmpty() ? p.unix() : p.tcp();
        if (address.isEmpty()) {
            throw new ExchangeReadException(where(p) + ": its service left no address to read it from");
        }
        if (!address.startsWith("unix:") && p.tls() && settings.tls() == null) {
            throw new ExchangeReadException(where(p) + " is held by a service on host " + p.hostId() + " that "
                    + "speaks TLS, and TLS is not configured here: set spark.sparkflow.exchange.tls.caFile to the CA "
                    + "that signed its certificate");
        }
        try {
            return new RemoteProducer(p, address, input.subpartitions(), secret, hostId, settings.tls(), connections);
        } catch (ServiceError e) {
            throw integrity(p, "lost", "its service at " + address + " cannot be asked for it: " + e.getMessage());
        }
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        batch = null;
        if (current != null) {
            current.close();
            current = null;
        }
        connections.close();
        if (live != null) {
            live.close();
        }
        decoder.close();
        root.close();
        allocator.close();
    }

    /**
     * A column of the reader's root as Spark sees it. Spark may close a batch it has consumed; closing an Arrow
     * struct or map vector removes its children, and the next buffer could not be loaded into the root. The root's
     * vectors are the reader's: it closes them itself, at its end.
     *
     * <p>A 128-bit decimal whose value fits a long is handed over as Spark's compact decimal, straight from the
     * buffer: Arrow's own accessor makes a {@code java.math.BigDecimal} of every value (measured: reading a
     * decimal(15,2) column cost 2.5x parquet's reader).
     */
    private static final class RootColumn extends ArrowColumnVector {
        private final DecimalVector decimal; // null unless a 128-bit decimal column
        private final boolean nullFree; // no null in this batch: Spark's per-row null checks need not read the bitmap

        RootColumn(org.apache.arrow.vector.ValueVector vector) {
            super(vector);
            decimal = vector instanceof DecimalVector d ? d : null;
            nullFree = vector.getNullCount() == 0;
        }

        @Override
        public boolean isNullAt(int rowId) {
            return !nullFree && super.isNullAt(rowId);
        }

        @Override
        public Decimal getDecimal(int rowId, int precision, int scale) {
            if (decimal == null || decimal.getScale() != scale) {
                return super.getDecimal(rowId, precision, scale);
            }
            if (!nullFree && decimal.isNull(rowId)) {
                return null;
            }
            ArrowBuf data = decimal.getDataBuffer();
            long at = (long) rowId * DecimalVector.TYPE_WIDTH;
            long low = data.getLong(at); // little endian, as Arrow lays out its decimals
            if (data.getLong(at + 8) != (low >> 63)) {
                return super.getDecimal(rowId, precision, scale); // beyond a long
            }
            return Decimal.apply(low, precision, scale);
        }

        @Override
        public void close() {
            // the reader's root owns the vector
        }
    }
}
