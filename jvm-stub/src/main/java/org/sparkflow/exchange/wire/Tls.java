package org.sparkflow.exchange.wire;

import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Collection;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.TrustManagerFactory;
import org.sparkflow.exchange.contract.Contract;

/**
 * A client's TLS settings, as the Python client reads them ({@code network/auth.py client_ssl_context}): the PEM
 * file of {@code tls.caFile}, else {@code tls.certFile}, is the only trust root; TLS 1.2 or later; the service's
 * certificate must name the host or IP address dialled (subjectAltName) unless {@code tls.checkHostname=false}.
 * Never used on a Unix socket. Null settings (neither file set): plaintext.
 */
public record Tls(String caFile, String certFile, boolean checkHostname) implements Serializable {
    private static final String[] PROTOCOLS = {"TLSv1.3", "TLSv1.2"};
    // one context per settings and trust file version: a CA file replaced in place is read again
    private static final Map<String, SSLContext> CONTEXTS = new ConcurrentHashMap<>();

    /** The TLS settings among the sparkflow-exchange keys without prefix, or null when TLS is not configured. */
    public static Tls from(Map<String, String> settings) {
        String ca = blankToNull(settings.get(Contract.Option.TLS_CA_FILE));
        String cert = blankToNull(settings.get(Contract.Option.TLS_CERT_FILE));
        if (ca == null && cert == null) {
            return null;
        }
        String check = settings.getOrDefault(Contract.Option.TLS_CHECK_HOSTNAME, String.valueOf(Contract.OptionDefault.TLS_CHECK_HOSTNAME)).trim().toLowerCase(Locale.ROOT);
        return switch (check) { // as config.py's booleans
            case "true", "1", "yes", "on" -> new Tls(ca, cert, true);
            case "false", "0", "no", "off" -> new Tls(ca, cert, false);
            default -> throw new IllegalArgumentException("tls.checkHostname: not a boolean: '"
                    + settings.get(Contract.Option.TLS_CHECK_HOSTNAME) + "'");
        };
    }

    private static String blankToNull(String value) {
        return value == null || value.isBlank() ? null : value.trim();
    }

    /** The setting whose file is trusted: {@code tls.caFile} when set, else {@code tls.certFile}. */
    public String trustSetting() {
        return caFile != null ? Contract.Option.TLS_CA_FILE : Contract.Option.TLS_CERT_FILE;
    }

    public String trustFile() {
        return caFile != null ? caFile : certFile;
    }

    /** A client engine for {@code host:port}: host-name checked (IP or DNS subjectAltName) unless switched off. */
    public SSLEngine engine(String host, int port) {
        long modified;
        try {
            modified = Files.getLastModifiedTime(Path.of(trustFile())).toMillis();
        } catch (IOException | RuntimeException e) {
            modified = -1; // missing or unreadable: context() says which
        }
        SSLEngine engine = CONTEXTS.computeIfAbsent(this + "@" + modified, key -> context(this))
                .createSSLEngine(host, port);
        engine.setUseClientMode(true);
        SSLParameters params = engine.getSSLParameters();
        params.setProtocols(PROTOCOLS);
        if (checkHostname) {
            params.setEndpointIdentificationAlgorithm("HTTPS");
        }
        engine.setSSLParameters(params);
        return engine;
    }

    /** The context trusting the PEM certificates of the trust file; an IllegalArgumentException naming it else. */
    private static SSLContext context(Tls tls) {
        String setting = tls.trustSetting();
        String file = tls.trustFile();
        Path path = Path.of(file);
        if (Files.isDirectory(path)) {
            throw new IllegalArgumentException(setting + " " + file + " is a directory, not a file");
        }
        Collection<? extends Certificate> certs;
        try (InputStream in = Files.newInputStream(path)) {
            certs = CertificateFactory.getInstance("X.509").generateCertificates(in);
        } catch (NoSuchFileException e) {
            throw new IllegalArgumentException(setting + " " + file + " does not exist");
        } catch (AccessDeniedException e) {
            throw new IllegalArgumentException(setting + " " + file + " cannot be read: Permission denied");
        } catch (IOException e) {
            throw new IllegalArgumentException(setting + " " + file + " cannot be read: " + e.getMessage());
        } catch (GeneralSecurityException e) {
            throw new IllegalArgumentException(setting + " " + file + " holds no PEM certificate to trust ("
                    + e.getMessage() + ")");
        }
        if (certs.isEmpty()) {
            throw new IllegalArgumentException(setting + " " + file + " holds no PEM certificate to trust");
        }
        try {
            KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
            store.load(null, null);
            int i = 0;
            for (Certificate cert : certs) {
                store.setCertificateEntry("trusted-" + i++, cert);
            }
            TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            trust.init(store);
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(null, trust.getTrustManagers(), null);
            return ctx;
        } catch (GeneralSecurityException | IOException e) {
            throw new IllegalArgumentException(setting + " " + file + " cannot serve as a trust root: "
                    + e.getMessage());
        }
    }
}
