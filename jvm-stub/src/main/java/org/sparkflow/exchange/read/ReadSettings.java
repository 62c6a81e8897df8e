package org.sparkflow.exchange.read;

import java.io.IOException;
import java.io.Serializable;
import java.net.InetAddress;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.sparkflow.exchange.contract.Contract;
import org.sparkflow.exchange.wire.Tls;

/**
 * What a read task needs of the catalog's settings: this host's identity (producers name theirs), the secret
 * that services of other hosts ask for, the coordinator (a read of an exchange being written asks it which
 * producers there are), and whether a read of an exchange being written reads it as it goes ({@code
 * format("pipelined")}) or is refused (the catalog, which waits up to its {@code commitTimeout} instead); the
 * client's TLS settings for services and the coordinator on TCP (null: plaintext). The read keys and their defaults
 * are the contract's ({@link Contract.Option}, {@link Contract.OptionDefault}).
 */
public record ReadSettings(String hostIdSetting, String secret, String coordinator, boolean whileWritten, Tls tls)
        implements Serializable {
    /** The read option that sets the number of read partitions (a number, or auto). */
    public static final String READ_PARTITIONS = Contract.Option.READ_PARTITIONS;
    /** {@link #READ_PARTITIONS} when a read does not say: the contract's (auto). */
    public static final String READ_PARTITIONS_DEFAULT = Contract.OptionDefault.READ_PARTITIONS;
    /** The catalog setting that reads exchanges being written as they go (default: {@link #WHILE_WRITTEN_DEFAULT}). */
    public static final String READ_WHILE_WRITTEN = Contract.Option.READ_WHILE_WRITTEN;
    public static final boolean WHILE_WRITTEN_DEFAULT = Contract.OptionDefault.READ_WHILE_WRITTEN;
    /** The catalog setting of how long loading a table waits for its exchange to commit (default: none). */
    public static final String COMMIT_TIMEOUT = Contract.Option.COMMIT_TIMEOUT;

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
