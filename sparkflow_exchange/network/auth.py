"""Authentication (HMAC challenge over a shared secret) and TLS contexts.

The server opens every connection with a random nonce; the client's first
message proves it knows the secret with HMAC-SHA256(secret, nonce), so the
secret itself never crosses the wire and a recorded proof cannot be replayed.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import ssl


def new_secret() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(16)


def prove(secret: str | None, nonce: str) -> str:
    if not secret:
        return ""
    return hmac.new(secret.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def verify(secret: str | None, nonce: str, proof: str) -> str | None:
    """None when the proof is good, else the reason for refusing the client."""
    if not secret:
        return None
    if not proof:
        return "authentication required: the client sent no secret proof (set spark.sparkflow.exchange.secret)"
    if not hmac.compare_digest(prove(secret, nonce), proof):
        return "authentication failed: wrong secret"
    return None


def server_ssl_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    if not cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def ssl_for(address: str, config) -> ssl.SSLContext | None:
    """The client context for a service address: TLS over TCP when configured, never on a Unix socket."""
    if address.startswith("unix:"):
        return None
    return client_ssl_context(config.tls_ca_file, config.tls_cert_file)


def client_ssl_context(ca_file: str | None, cert_file: str | None = None) -> ssl.SSLContext | None:
    """A client context when TLS is configured; the service's certificate (or CA) is the trust root."""
    trust = ca_file or cert_file
    if not trust:
        return None
    ctx = ssl.create_default_context(cafile=trust)
    ctx.check_hostname = False  # services are addressed by IP; the pinned CA is the identity check
    return ctx
