package org.sparkflow.exchange.discovery;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermission;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Set;

/**
 * The per-user runtime directory's state files ({@code service/private_files.py}, {@code discovery.py}): only a
 * regular file of this user with mode 0600, in a directory of this user with mode 0700, naming a live process,
 * is believed; anything else is ignored (another user could have planted it).
 */
public final class RuntimeDir {
    private static final ObjectMapper MAPPER = new ObjectMapper();
    private static final Set<PosixFilePermission> OWNER_RW =
            EnumSet.of(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE);
    private final Path dir;

    public RuntimeDir(Path dir) {
        this.dir = dir;
    }

    /** {@code $SPARKFLOW_EXCHANGE_RUNTIME_DIR}, else {@code /tmp/sparkflow-exchange-<uid>}. */
    public static RuntimeDir standard() {
        String env = System.getenv("SPARKFLOW_EXCHANGE_RUNTIME_DIR");
        if (env != null && !env.isEmpty()) {
            return new RuntimeDir(Paths.get(env));
        }
        return new RuntimeDir(Paths.get("/tmp/sparkflow-exchange-" + uid()));
    }

    public Path path() {
        return dir;
    }

    static long uid() {
        return new com.sun.security.auth.module.UnixSystem().getUid();
    }

    private boolean privateDir() {
        try {
            if (!Files.isDirectory(dir, LinkOption.NOFOLLOW_LINKS)) {
                return false;
            }
            return ((Number) Files.getAttribute(dir, "unix:uid", LinkOption.NOFOLLOW_LINKS)).longValue() == uid()
                    && EnumSet.of(PosixFilePermission.OWNER_READ, PosixFilePermission.OWNER_WRITE,
                            PosixFilePermission.OWNER_EXECUTE).containsAll(
                            Files.getPosixFilePermissions(dir, LinkOption.NOFOLLOW_LINKS));
        } catch (IOException | UnsupportedOperationException e) {
            return false;
        }
    }

    /** The state file's JSON when it is to be trusted and its process lives; null otherwise. */
    public JsonNode state(Path file) {
        try {
            if (!Files.isRegularFile(file, LinkOption.NOFOLLOW_LINKS)
                    || ((Number) Files.getAttribute(file, "unix:uid", LinkOption.NOFOLLOW_LINKS)).longValue() != uid()
                    || !Files.getPosixFilePermissions(file, LinkOption.NOFOLLOW_LINKS).equals(OWNER_RW)) {
                return null;
            }
            JsonNode info = MAPPER.readTree(Files.readString(file));
            if (info == null || !info.isObject() || !info.path("pid").canConvertToLong()) {
                return null;
            }
            return ProcessHandle.of(info.get("pid").asLong()).map(ProcessHandle::isAlive).orElse(false) ? info : null;
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    /** Live state files matching {@code glob}, sorted by name (none when the directory is not private). */
    public List<JsonNode> states(String glob) {
        List<JsonNode> out = new ArrayList<>();
        if (!privateDir()) {
            return out;
        }
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> stream = Files.newDirectoryStream(dir, glob)) {
            stream.forEach(files::add);
        } catch (IOException e) {
            return out;
        }
        files.sort(null);
        for (Path file : files) {
            if (file.getFileName().toString().contains(".exchanges.")) {
                continue; // a coordinator's ledger, not a state file
            }
            JsonNode info = state(file);
            if (info != null && info.hasNonNull("unix")) {
                out.add(info);
            }
        }
        return out;
    }
}
