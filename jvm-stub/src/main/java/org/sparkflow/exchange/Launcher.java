package org.sparkflow.exchange;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Runs {@code python -m sparkflow_exchange.service.plugin ...}: all service logic lives in Python;
 * this side only starts the launcher, hands it the settings and reads back one JSON line.
 */
final class Launcher {
    static final String PREFIX = "spark.sparkflow.exchange.";

    private Launcher() {}

    /** The Python interpreter executors use: spark.pyspark.python, else PYSPARK_PYTHON, else python3. */
    static String python(String confValue) {
        if (confValue != null && !confValue.isEmpty()) {
            return confValue;
        }
        String env = System.getenv("PYSPARK_PYTHON");
        return env != null && !env.isEmpty() ? env : "python3";
    }

    /** Every spark.sparkflow.exchange.* entry, with the prefix stripped. */
    static Map<String, String> settings(Iterable<Map.Entry<String, String>> conf) {
        Map<String, String> out = new LinkedHashMap<>();
        for (Map.Entry<String, String> e : conf) {
            if (e.getKey().startsWith(PREFIX)) {
                out.put(e.getKey().substring(PREFIX.length()), e.getValue());
            }
        }
        return out;
    }

    /** Run the launcher and return its one JSON line of output; throws with its stderr on failure. */
    static String run(String python, Map<String, String> settings, long timeoutSeconds, String... args) {
        List<String> command = new ArrayList<>();
        command.add(python);
        command.add("-m");
        command.add("sparkflow_exchange.service.plugin");
        for (String a : args) {
            command.add(a);
        }
        File errFile = null;
        try {
            errFile = File.createTempFile("sparkflow-plugin-", ".log");
            ProcessBuilder pb = new ProcessBuilder(command);
            pb.environment().put("SPARKFLOW_EXCHANGE_CONF", Json.object(settings));
            pb.redirectError(errFile);
            pb.redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")));
            Process p = pb.start();
            String out = readAll(p.getInputStream());
            if (!p.waitFor(timeoutSeconds, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                throw new RuntimeException("sparkflow-exchange launcher timed out after " + timeoutSeconds + " s: " + command);
            }
            if (p.exitValue() != 0) {
                String err = new String(Files.readAllBytes(errFile.toPath()), StandardCharsets.UTF_8);
                throw new RuntimeException("sparkflow-exchange launcher failed (exit " + p.exitValue() + "): "
                        + command + "\n" + err);
            }
            String[] lines = out.trim().split("\n");
            return lines[lines.length - 1];
        } catch (IOException e) {
            throw new RuntimeException("cannot run the sparkflow-exchange launcher " + command + ": " + e.getMessage()
                    + " (is the sparkflow-exchange package installed for " + python + "?)", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new RuntimeException("interrupted while starting the exchange service", e);
        } finally {
            if (errFile != null) {
                errFile.delete();
            }
        }
    }

    private static String readAll(InputStream in) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        byte[] chunk = new byte[8192];
        int n;
        while ((n = in.read(chunk)) > 0) {
            buf.write(chunk, 0, n);
        }
        return buf.toString(StandardCharsets.UTF_8);
    }
}
