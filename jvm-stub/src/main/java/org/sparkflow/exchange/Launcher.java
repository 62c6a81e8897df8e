package org.sparkflow.exchange;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkConf;
import scala.Tuple2;

/**
 * Runs {@code <python> -m sparkflow_exchange.service.plugin ...}: all service logic lives in Python;
 * this side only starts the launcher, hands it the settings (JSON in SPARKFLOW_EXCHANGE_CONF) and
 * reads back its one JSON line.
 *
 * <p>The child's stdout and stderr are pipes drained by two daemon threads, never files: a JVM killed
 * while the launcher runs (an executor ended during its plugin's shutdown) leaves nothing on disk. A
 * pipe never fills up and blocks the child (it is drained as it comes), and a background service
 * that inherited it cannot keep us waiting for EOF: once the launcher has exited we wait at most
 * {@code DRAIN_GRACE_MS} for the rest. The timeout therefore bounds the whole call.
 */
public final class Launcher {
    static final String PREFIX = org.sparkflow.exchange.contract.Contract.Option.PREFIX;
    static final String CONF_ENV = "SPARKFLOW_EXCHANGE_CONF";
    static final String MODULE = "sparkflow_exchange.service.plugin";
    private static final int STDERR_LIMIT = 16 * 1024;
    private static final int STDOUT_LIMIT = 1024 * 1024; // the JSON line is the last one: the tail is kept
    private static final long DRAIN_GRACE_MS = 2000;

    private Launcher() {}

    /** The Python interpreter: the spark.pyspark.python value, else PYSPARK_PYTHON, else python3. */
    static String python(String confValue) {
        if (confValue != null && !confValue.trim().isEmpty()) {
            return confValue.trim();
        }
        String env = System.getenv("PYSPARK_PYTHON");
        return env != null && !env.trim().isEmpty() ? env.trim() : "python3";
    }

    /** Every spark.sparkflow.exchange.* entry of {@code conf}, with the prefix stripped. */
    static Map<String, String> settings(SparkConf conf) {
        Map<String, String> all = new HashMap<>();
        for (Tuple2<String, String> t : conf.getAll()) {
            all.put(t._1(), t._2());
        }
        return settings(all.entrySet());
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
        try {
            ProcessBuilder pb = new ProcessBuilder(command);
            pb.environment().put(CONF_ENV, Json.object(settings));
            Process p = pb.start();
            p.getOutputStream().close(); // no stdin
            Drain stdout = new Drain(p.getInputStream(), STDOUT_LIMIT, "stdout");
            Drain stderr = new Drain(p.getErrorStream(), STDERR_LIMIT, "stderr");
            if (!p.waitFor(timeoutSeconds, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                p.waitFor(5, TimeUnit.SECONDS);
                stderr.await(DRAIN_GRACE_MS);
                throw new RuntimeException("sparkflow-exchange launcher timed out after " + timeoutSeconds
                        + " s and was killed: " + command + stderr.message());
            }
            stdout.await(DRAIN_GRACE_MS);
            stderr.await(DRAIN_GRACE_MS);
            if (p.exitValue() != 0) {
                // the launcher's own one line first: Spark shows a failed executor by its reason's first line
                String said = stderr.lastLine();
                throw new RuntimeException((said.isEmpty() ? "" : said + "\n") + "sparkflow-exchange launcher failed "
                        + "(exit " + p.exitValue() + "): " + command + stderr.message());
            }
            String out = stdout.text();
            String line = null;
            for (String l : out.split("\r?\n")) {
                if (l.trim().startsWith("{")) {
                    line = l.trim();
                }
            }
            if (line == null) {
                throw new RuntimeException("sparkflow-exchange launcher printed no JSON line: " + command
                        + "\nstdout: " + out + stderr.message());
            }
            try {
                return Json.parseObject(line);
            } catch (IllegalArgumentException e) {
                throw new RuntimeException("sparkflow-exchange launcher printed unreadable JSON: " + command
                        + ": " + e.getMessage() + stderr.message(), e);
            }
        } catch (IOException e) {
            throw new RuntimeException("cannot run the sparkflow-exchange launcher " + command + ": " + e
                    + " (is Python with the sparkflow-exchange package at " + python
                    + "? set spark.pyspark.python or PYSPARK_PYTHON)", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RuntimeException("interrupted while running the sparkflow-exchange launcher " + command, e);
        }
    }

    /**
     * Start or join this user's embedded service on this host, attached to this JVM, as the Python writer does on
     * first use: for the JVM path of {@code format("pipelined")} in a local application that found no service.
     */
    public static void embeddedService(SparkConf conf) {
        run(python(conf.get("spark.pyspark.python", "")), settings(conf), 60, "embedded",
                "--jvm-pid", Long.toString(ProcessHandle.current().pid()));
    }

    /** Reads one of the child's pipes to its end on a daemon thread, keeping the last {@code limit} bytes. */
    private static final class Drain implements Runnable {
        private final InputStream in;
        private final int limit;
        private final Thread thread;
        private byte[] kept = new byte[0];
        private IOException failure;

        Drain(InputStream in, int limit, String name) {
            this.in = in;
            this.limit = limit;
            this.thread = new Thread(this, "sparkflow-exchange-launcher-" + name);
            this.thread.setDaemon(true);
            this.thread.start();
        }

        @Override
        public void run() {
            byte[] buf = new byte[8192];
            try (InputStream stream = in) {
                int n;
                while ((n = stream.read(buf)) > 0) {
                    append(buf, n);
                }
            } catch (IOException e) {
                synchronized (this) {
                    failure = e;
                }
            }
        }

        private synchronized void append(byte[] buf, int n) {
            int total = Math.min(limit, kept.length + n);
            byte[] next = new byte[total];
            int fromKept = Math.max(0, total - n);
            System.arraycopy(kept, kept.length - fromKept, next, 0, fromKept);
            System.arraycopy(buf, Math.max(0, n - total), next, fromKept, total - fromKept);
            kept = next;
        }

        /** Wait up to {@code millis} for the end of the pipe (a background process may hold it open). */
        void await(long millis) throws InterruptedException {
            thread.join(millis);
        }

        synchronized String text() {
            return new String(kept, StandardCharsets.UTF_8);
        }

        /** The last non-empty line read so far ("" when none). */
        synchronized String lastLine() {
            String[] lines = text().trim().split("\r?\n");
            return lines[lines.length - 1].trim();
        }

        /** The text read so far, prefixed for appending to a message. */
        synchronized String message() {
            if (failure != null && kept.length == 0) {
                return "\nstderr: (unreadable: " + failure.getMessage() + ")";
            }
            String text = text().trim();
            return text.isEmpty() ? "\nstderr: (empty)" : "\nstderr:\n" + text;
        }
    }
}
