package org.sparkflow.exchange.discovery;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Map;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.wire.Tls;

/**
 * Which coordinator the catalog asks, in the Python client's order ({@code service/discovery.py}), never starting
 * one: the {@code coordinator} setting (with {@code secret} or {@code secretFile}); else the Spark plugin's state
 * file for this JVM ({@code jvm-<pid>.json}); else the embedded service of local mode ({@code embedded.json});
 * else a service started by {@code sparkflow-exchange serve} or the plugin that has the coordinator role.
 */
public final class Discovery {
    private Discovery() {}

    /** ``settings``: the sparkflow-exchange keys without prefix (coordinator, secret, secretFile, hostId, tls.*). */
    public static Endpoint find(Map<String, String> settings, RuntimeDir runtime) {
        String secret = secret(settings);
        String hostId = settings.getOrDefault(Contract.Option.HOST_ID, "");
        Tls tls = Tls.from(settings);
        String coordinator = settings.get(Contract.Option.COORDINATOR);
        if (coordinator != null && !coordinator.isBlank()) {
            return new Endpoint(coordinator.trim(), secret, hostId, "the coordinator setting", tls);
        }
        JsonNode plugin = runtime.state(runtime.path().resolve("jvm-" + ProcessHandle.current().pid() + ".json"));
        if (plugin != null && plugin.hasNonNull("coordinator_address")) {
            return endpoint(plugin, plugin.get("coordinator_address").asText(), secret, hostId,
                    "the Spark plugin's state file", tls);
        }
        JsonNode embedded = runtime.state(runtime.path().resolve("embedded.json"));
        if (embedded != null && embedded.hasNonNull("unix")) {
            return endpoint(embedded, embedded.get("unix").asText(), secret, hostId,
                    "the embedded service's state file", tls);
        }
        for (String glob : List.of("serve-*.json", "coordinator-*.json")) {
            for (JsonNode info : runtime.states(glob)) {
                if (info.path("coordinator").asBoolean(false)) {
                    return endpoint(info, info.get("unix").asText(), secret, hostId,
                            "a running service's state file", tls);
                }
            }
        }
        throw new IllegalStateException("no exchange coordinator to ask: the coordinator setting is not set "
                + "(spark.sparkflow.exchange.coordinator, or spark.sql.catalog.<name>.coordinator) and " + runtime.path()
                + " names no running embedded service, none started by `sparkflow-exchange serve` and none of the "
                + "Spark plugin's; write an exchange first, or set the coordinator");
    }

    /**
     * This host's exchange service, which a writer pushes its partition to ({@code resolve} in
     * {@code service/discovery.py}): the {@code service} setting; else the Spark plugin's service for this JVM;
     * else the service of {@code sparkflow-exchange serve} reporting to the configured coordinator; else the
     * coordinator's own service (the embedded one of local mode).
     */
    public static Endpoint service(Map<String, String> settings, RuntimeDir runtime) {
        String service = settings.get(Contract.Option.SERVICE);
        if (service != null && !service.isBlank()) {
            Endpoint c = find(settings, runtime);
            return new Endpoint(service.trim(), c.secret(), c.hostId(), "the service setting", c.tls());
        }
        String secret = secret(settings);
        String hostId = settings.getOrDefault(Contract.Option.HOST_ID, "");
        Tls tls = Tls.from(settings);
        JsonNode plugin = runtime.state(runtime.path().resolve("jvm-" + ProcessHandle.current().pid() + ".json"));
        if (plugin != null && plugin.hasNonNull("unix")) {
            return endpoint(plugin, plugin.get("unix").asText(), secret, hostId, "the Spark plugin's state file", tls);
        }
        String coordinator = settings.get(Contract.Option.COORDINATOR);
        if (coordinator != null && !coordinator.isBlank()) {
            for (JsonNode info : runtime.states("serve-*.json")) {
                if (coordinator.trim().equals(info.path("reports_to").asText())) {
                    return endpoint(info, info.get("unix").asText(), secret, hostId,
                            "this host's service's state file", tls);
                }
            }
        }
        return find(settings, runtime);
    }

    private static Endpoint endpoint(JsonNode info, String address, String secret, String hostId, String source,
                                     Tls tls) {
        String s = secret != null ? secret : info.path("secret").asText(null);
        String h = !hostId.isEmpty() ? hostId : info.path("host_id").asText("");
        return new Endpoint(address, s, h, source + " in the runtime directory", tls);
    }

    private static String secret(Map<String, String> settings) {
        String secret = settings.get(Contract.Option.SECRET);
        if (secret != null && !secret.isEmpty()) {
            return secret;
        }
        String file = settings.get(Contract.Option.SECRET_FILE);
        if (file != null && !file.isEmpty()) {
            return readSecretFile(file);
        }
        return null;
    }

    /**
     * The secret in {@code file}, stripped, as the Python side reads it ({@code config.read_secret_file}): a
     * file others may read or change (mode o+r, o+w, g+w) is refused, and so is an empty one; every refusal
     * names the file and the cause.
     */
    public static String readSecretFile(String file) {
        Path path = Paths.get(file);
        if (!Files.exists(path)) {
            throw new IllegalArgumentException("secretFile " + file + " does not exist");
        }
        if (Files.isDirectory(path)) {
            throw new IllegalArgumentException("secretFile " + file + " is a directory, not a file");
        }
        if (!Files.isRegularFile(path)) {
            throw new IllegalArgumentException("secretFile " + file + " is not a regular file");
        }
        int mode;
        try {
            mode = ((Number) Files.getAttribute(path, "unix:mode")).intValue() & 07777;
        } catch (IOException | UnsupportedOperationException e) {
            throw new IllegalArgumentException("secretFile " + file + " cannot be read: " + e.getMessage(), e);
        }
        if ((mode & 026) != 0) {
            String who = (mode & 04) != 0 ? "other users of this host may read it" : "other users of this host may change it";
            throw new IllegalArgumentException("secretFile " + file + " has mode " + Integer.toOctalString(mode) + ": "
                    + who + ", and it holds a secret (chmod 600 " + file + ", as its owner)");
        }
        String text;
        try {
            text = Files.readString(path, StandardCharsets.UTF_8).strip();
        } catch (java.nio.charset.CharacterCodingException e) {
            throw new IllegalArgumentException("secretFile " + file + " is not text", e);
        } catch (java.nio.file.AccessDeniedException e) {
            throw new IllegalArgumentException("secretFile " + file + " cannot be read: Permission denied", e);
        } catch (IOException e) {
            throw new IllegalArgumentException("secretFile " + file + " cannot be read: " + e.getMessage(), e);
        }
        if (text.isEmpty()) {
            throw new IllegalArgumentException("secretFile " + file + " is empty: it must hold the secret (e.g. "
                    + "`openssl rand -hex 32 > " + file + "; chmod 600 " + file + "`)");
        }
        return text;
    }
}
