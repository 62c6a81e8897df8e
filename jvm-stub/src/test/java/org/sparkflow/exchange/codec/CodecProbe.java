package org.sparkflow.exchange.codec;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.HexFormat;
import org.apache.arrow.compression.ZstdCompressionCodec;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.compression.CompressionCodec;

/** The writer's codecs, for {@code UnitDriver}'s {@code zstd_context} request. */
public final class CodecProbe {
    private static final ObjectMapper JSON = new ObjectMapper();

    private CodecProbe() {}

    /**
     * {@code {"buffers": ["hex", ..]}}: each buffer compressed, in order, by one {@link ZstdContextCodec} (one kept
     * context, as a writer uses it) and by Arrow's own ZSTD codec at the same level: {@code "kept"} and
     * {@code "arrow"}, hex each (with their 8-byte uncompressed length), {@code "round_trip"}: the kept codec's
     * buffers decompressed by Arrow's codec, hex; then the codec closed (twice) and asked again: {@code "closed"},
     * its error. {@code "read_back"}: Arrow's buffers decompressed by one reader's codec ({@link Codecs#forReading},
     * one kept context), hex; {@code "corrupt"}: its error for Arrow's buffer number {@code "cut"} cut to half its bytes;
     * {@code "read_closed"}: its error once closed.
     */
    public static ObjectNode zstdContext(JsonNode r) {
        ObjectNode out = JSON.createObjectNode();
        ArrayNode kept = out.putArray("kept");
        ArrayNode arrow = out.putArray("arrow");
        ArrayNode roundTrip = out.putArray("round_trip");
        ArrayNode readBack = out.putArray("read_back");
        try (BufferAllocator allocator = new RootAllocator()) {
            ZstdContextCodec codec = ZstdContextCodec.forWriting(Codecs.ZSTD_LEVEL);
            CompressionCodec reference = new ZstdCompressionCodec(Codecs.ZSTD_LEVEL);
            for (JsonNode b : r.path("buffers")) {
                byte[] data = HexFormat.of().parseHex(b.asText());
                byte[] mine = drain(codec.compress(allocator, filled(allocator, data)));
                kept.add(HexFormat.of().formatHex(mine));
                arrow.add(HexFormat.of().formatHex(drain(reference.compress(allocator, filled(allocator, data)))));
                roundTrip.add(HexFormat.of().formatHex(drain(reference.decompress(allocator, filled(allocator, mine)))));
            }
            codec.close();
            codec.close();
            ArrowBuf again = filled(allocator, new byte[64]);
            try {
                codec.compress(allocator, again).close();
                out.putNull("closed");
            } catch (RuntimeException e) {
                out.put("closed", e.getClass().getSimpleName() + ": " + e.getMessage());
                again.close();
            }
            Codecs.Reading reading = Codecs.forReading();
            CompressionCodec reader = reading.createCodec(org.apache.arrow.vector.compression.CompressionUtil.CodecType.ZSTD);
            for (JsonNode h : arrow) {
                readBack.add(HexFormat.of().formatHex(drain(reader.decompress(allocator,
                        filled(allocator, HexFormat.of().parseHex(h.asText()))))));
            }
            byte[] whole = HexFormat.of().parseHex(arrow.get(r.path("cut").asInt()).asText());
            byte[] corrupt = java.util.Arrays.copyOf(whole, whole.length / 2);
            out.put("corrupt", refusal(reader, allocator, corrupt));
            reading.close();
            reading.close();
            out.put("read_closed", refusal(reader, allocator, whole));
        }
        return out;
    }

    /** What decompressing {@code bytes} threw (its class and message), or null (the buffer given is freed either way). */
    private static String refusal(CompressionCodec codec, BufferAllocator allocator, byte[] bytes) {
        ArrowBuf in = filled(allocator, bytes);
        try {
            drain(codec.decompress(allocator, in)); // frees what it was given when it succeeds
            return null;
        } catch (RuntimeException e) {
            in.close();
            return e.getClass().getSimpleName() + ": " + e.getMessage();
        }
    }

    private static ArrowBuf filled(BufferAllocator allocator, byte[] data) {
        ArrowBuf buf = allocator.buffer(Math.max(1, data.length));
        buf.setBytes(0, data);
        buf.writerIndex(data.length);
        return buf;
    }

    private static byte[] drain(ArrowBuf buf) {
        try {
            byte[] bytes = new byte[(int) buf.writerIndex()];
            buf.getBytes(0, bytes);
            return bytes;
        } finally {
            buf.close();
        }
    }
}
