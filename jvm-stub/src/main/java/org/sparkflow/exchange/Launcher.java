package org.sparkflow.exchange;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;

/**
 * Runs {@code <python> -m sparkflow_exchange.service.plugin ...}: all service logic lives in Python;
 * this side only starts the launcher, hands it the settings (JSON in SPARKFLOW_EXCHANGE_CONF) and
 * reads back its one JSON line.
 *
 * <p>The child's stdout and stderr go to temporary files, not pipes: a pipe can neither fill up and
 * block the child, nor keep us waiting for EOF when the launcher leaves a background service
 * behind that inherited it. The timeout therefore bounds the whole call.
 */
public final class Launcher {
    static final String PREFIX = "spark.sparkflow.exchange.";
    static final String CONF_ENV = "SPARKFLOW_EXCHANGE_CONF";
    static final String MODULE = "sparkflow_exchange.service.plugin";
    private static final int STDERR_LIMIT = 16 * 1024;

    private Launcher() {}

    /** The Python interpreter: the spark.pyspark.python value, else PYSPARK_PYTHON, else python3. */
    static String python(String confValue) {
        if (confValue != null && !confValue.trim().isEmpty()) {
            return confValue.trim();
        }
        String env = System.getenv("PYSPARK_PYTHON");
        return env != null && !env.trim().isEmpty() ? env.trim() : "python3";
    }

    /** Every spark.sparkflow.exchange.* entry, with the prefix stripped. */
    static Map<String, String> settings(Iterable<Map.Entry<String, String>> conf) {
        Map<String, String> out = new LinkedHashMap<>();
        for (Map.Entry<String, String> e : conf) {
            if (e.getKey().startsWith(PREFIX) && e.getKey().length() > PREFIX.length()) {
                out.put(e.getKey().substring(PREFIX.length()), e.getValue());
            }
        }
        return out;
    }

    /**
     * Runs the launcher and returns its JSON line (the last stdout line that is a JSON object) as a
     * map of its top-level fields. Throws a RuntimeException, including the launcher's stderr, when it cannot be
     * started, exceeds the timeout (it is then killed), exits non-zero or prints no JSON object.
     */
    static Map<String, String> run(String python, Map<String, String> settings, long timeoutSeconds,
                                   String... args) {
        List<String> command = new ArrayList<>();
        command.add(python);
        command.add("-m");
        command.add(MODULE);
        command.addAll(Arrays.asList(args));
        File outFile = null;
        File errFile = null;
        try {
            outFile = File.createTempFile("sparkflow-plugin-", ".out");
            errFile = File.createTempFile("sparkflow-plugin-", ".err");
            ProcessBuilder pb = new ProcessBuilder(command);
            pb.environment().put(CONF_ENV, Json.object(settings));
            pb.redirectOutput(outFile);
            pb.redirectError(errFile);
            Process p = pb.start();
            p.getOutputStream().close(); // no stdin
            if (!p.waitFor(timeoutSeconds, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                p.waitFor(5, TimeUnit.SECONDS);
                throw new RuntimeException("sparkflow-exchange launcher timed out after " + timeoutSeconds
                        + " s and was killed: " + command + stderr(errFile));
            }
            if (p.exitValue() != 0) {
                throw new RuntimeException("sparkflow-exchange launcher failed (exit " + p.exitValue() + "): "
                        + command + stderr(errFile));
            }
            String out = new String(Files.readAllBytes(outFile.toPath()), StandardCharsets.UTF_8);
            String line = null;
            for (String l : out.split("\r?\n")) {
                if (l.trim().startsWith("{")) {
                    line = l.trim();
                }
            }
            if (line == null) {
                throw new RuntimeException("sparkflow-exchange launcher printed no JSON line: " + command
                        + "\nstdout: " + out + stderr(errFile));
            }
            try {
                return Json.parseObject(line);
            } catch (IllegalArgumentException e) {
                throw new RuntimeException("sparkflow-exchange launcher printed unreadable JSON: " + command
                        + ": " + e.getMessage() + stderr(errFile), e);
            }
        } catch (IOException e) {
            throw new RuntimeException("cannot run the sparkflow-exchange launcher " + command + ": " + e
                    + " (is Python with the sparkflow-exchange package at " + python
                    + "? set spark.pyspark.python or PYSPARK_PYTHON)", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RuntimeException("interrupted while running the sparkflow-exchange launcher " + command, e);
        } finally {
            if (outFile != null) {
                outFile.delete();
            }
            if (errFile != null) {
                errFile.delete();
            }
        }
    }

    /**
     * Start or join this user's embedded service on this host, attached to this JVM, as the Python writer does on
     * first use: for the JVM path of {@code format("pipelined")} in a local application that found no service.
     */
    public static void embeddedService(SparkConf conf) {
        run(python(conf.get("spark.pyspark.python", "")), settings(ExchangePlugin.entries(conf)), 60, "embedded",
                "--jvm-pid", Long.toString(ProcessHandle.current().pid()));
    }

    /** The launcher's stderr (its last 16 KiB), prefixed for appending to a message. */
    private static String stderr(File errFile) {
        try {
            byte[] all = Files.readAllBytes(errFile.toPath());
            int from = Math.max(0, all.length - STDERR_LIMIT);
            String text = new String(all, from, all.length - from, StandardCharsets.UTF_8).trim();
            return text.isEmpty() ? "\nstderr: (empty)" : "\nstderr:\n" + text;
        } catch (IOException e) {
            return "\nstderr: (unreadable: " + e.getMessage() + ")";
        }
    }
}
