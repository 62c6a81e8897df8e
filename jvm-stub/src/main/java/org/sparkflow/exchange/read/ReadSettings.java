package org.sparkflow.exchange.read;

import java.io.IOException;
import java.io.Serializable;
import java.net.InetAddress;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.sparkflow.exchange.wire.Tls;

/**
 * What a read task needs of the catalog's settings: this host's identity (producers name theirs), the secret
 * that services of other hosts ask for, the coordinator (a read of an exchange being written asks it which
 * producers there are), and whether a read of an exchange being written reads it as it goes ({@code
 * format("pipelined")}) or is refused (the catalog, which waits up to its {@code commitTimeout} instead); the
 * client's TLS settings for services and the coordinator on TCP (null: plaintext).
 */
public record ReadSettings(String hostIdSetting, String secret, String coordinator, boolean whileWritten, Tls tls)
        implements Serializable {
    /** The read option that sets the number of read partitions (a number, or auto). */
    public static final String READ_PARTITIONS = "readPartitions";

    /** These settings, reading exchanges being written as they go. */
    public ReadSettings readingWhileWritten() {
        return new ReadSettings(hostIdSetting, secret, coordinator, true, tls);
    }

    /** The {@code hostId} setting, else the host name as Python's {@code socket.gethostname()} reports it. */
    public String hostId() {
        if (hostIdSetting != null && !hostIdSetting.isEmpty()) {
            return hostIdSetting;
        }
        try {
            return Files.readString(Paths.get("/proc/sys/kernel/hostname")).strip();
        } catch (IOException | RuntimeException e) {
            try {
                return InetAddress.getLocalHost().getHostName();
            } catch (IOException e2) {
                return "";
            }
        }
    }
}
