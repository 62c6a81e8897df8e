"""Authentication (mutual HMAC challenge over a shared secret) and TLS contexts.

The server opens every connection with a random nonce and its service id; the client's first message
carries a nonce of its own and proves it knows the secret with
HMAC-SHA256(secret, "client-to-service:" server nonce ":" client nonce ":" service id); the server's
Welcome answers with HMAC-SHA256(secret, "service-to-client:" client nonce ":" server nonce ":" service id).
So the secret never crosses the wire, each proof belongs to one connection (both nonces) and to the
service it was made for, a recorded proof cannot be replayed, and a client talks to a service only after
the service proved the secret too (a stranger listening on a well-known port learns nothing and is told
nothing). The role prefixes keep one side's proof from serving as the other's. A client that knows which
service it means to reach (a producer's location names it) refuses to prove anything to another
(``ClientHandshake``'s ``expect_service``): a listener that relays the real service's greeting gets no proof
made for a service it is not. Nonces are 32 lowercase hex digits, so the proven message has one reading.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import ssl
from typing import Mapping, NamedTuple

from ..config import open_regular_file
from ..errors import ConfigError

OPERATOR = "operator"  # the identity of the service's own secret: every operation is allowed to it


class Credential(NamedTuple):
    """Who a connection authenticated as: a credential's name and its secret (the service proves the same)."""

    name: str
    secret: str | None


def new_secret() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(16)


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


NONCE_DIGITS = 32  # hex digits of a nonce (16 random bytes)
_HEX = frozenset("0123456789abcdef")


def valid_nonce(nonce: object) -> bool:
    """A nonce as both sides make them: 32 lowercase hex digits (nothing that could shift a field)."""
    return isinstance(nonce, str) and len(nonce) == NONCE_DIGITS and _HEX.issuperset(nonce)


def prove(secret: str | None, server_nonce: str, client_nonce: str, service_id: str) -> str:
    """The client's proof for one connection (both nonces) to one service ("" without a secret)."""
    return _mac(secret, f"client-to-service:{server_nonce}:{client_nonce}:{service_id}") if secret else ""


def prove_service(secret: str | None, client_nonce: str, server_nonce: str, service_id: str) -> str:
    """The service's proof for one connection, naming itself ("" without a secret)."""
    return _mac(secret, f"service-to-client:{client_nonce}:{server_nonce}:{service_id}") if secret else ""


def identify(credentials: Mapping[str, str], server_nonce: str, client_nonce: str, service_id: str,
             proof: str) -> Credential | str:
    """The credential whose secret made the client's proof, or the reason for refusing the client.

    ``credentials``: name -> secret, the operator's (the service's secret) among them; none at all means a
    service without authentication, whose every client is the operator. The proof must be made for this
    connection's nonces and for this service (``service_id``)."""
    if not credentials:
        return Credential(OPERATOR, None)
    if not proof:
        return ("authentication required: the client sent no proof of a secret (it needs the secret or "
                "secretFile setting)")
    if not valid_nonce(client_nonce):
        return (f"authentication failed: the client's nonce is not {NONCE_DIGITS} lowercase hex digits (a client "
                "of another version?)")
    found = None
    for name, secret in credentials.items():  # every one compared, in constant time: no early exit
        if hmac.compare_digest(prove(secret, server_nonce, client_nonce, service_id), proof):
            found = Credential(name, secret)
    return found if found is not None else "authentication failed: wrong secret"


def verify_service(secret: str | None, client_nonce: str, server_nonce: str, service_id: str,
                   proof: str) -> str | None:
    """None when the service proved the secret (or no secret is in use), else why it is not trusted."""
    if not secret:
        return None
    if not proof:
        return "the service did not prove that it knows the shared secret (it runs without one, or is not ours)"
    if not hmac.compare_digest(prove_service(secret, client_nonce, server_nonce, service_id), proof):
        return "the service answered with a wrong secret proof (another secret, or not a service we trust)"
    return None


def server_ssl_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """The service's TLS context (None without ``tls.certFile``); ConfigError naming the file and the cause
    when TLS is half configured or a file cannot serve (never plaintext in its place)."""
    if not cert_file:
        if key_file:
            raise ConfigError(f"tls.keyFile {key_file} is set but tls.certFile is not: TLS needs both, and the "
                              "service will not listen in plaintext in its place (set tls.certFile, or unset "
                              "tls.keyFile)")
        return None
    for setting, path in (("tls.certFile", cert_file), ("tls.keyFile", key_file)):
        if path:
            _check_readable(setting, path)
    try:  # the certificate alone first: an error then names the file at fault
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"tls.certFile {cert_file} holds no PEM certificate ({exc.reason or exc})") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    def no_pass_phrase() -> str:  # never a prompt on the terminal of a service
        raise ConfigError(f"tls.keyFile {key_file or cert_file} is encrypted (it asks for a pass phrase): give the "
                          "service an unencrypted key, readable by its user alone (chmod 600)")

    try:
        ctx.load_cert_chain(cert_file, key_file, password=no_pass_phrase)
    except ssl.SSLError as exc:
        if not key_file:
            raise ConfigError(f"tls.certFile {cert_file} holds no private key and tls.keyFile is not set: set "
                              f"tls.keyFile to the certificate's key ({exc.reason or exc})") from None
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"tls.keyFile {key_file} is not the private key of tls.certFile {cert_file}") from None
        raise ConfigError(f"tls.keyFile {key_file} holds no usable PEM private key ({exc.reason or exc})") from None
    return ctx


def _check_readable(setting: str, path: str) -> None:
    """ConfigError naming a TLS file that is missing, a directory or unreadable (ssl's own errors name none)."""
    os.close(open_regular_file(path, setting))


def ssl_for(address: str, config) -> ssl.SSLContext | None:
    """The client context for a service address: TLS over TCP when configured, never on a Unix socket."""
    if address.startswith("unix:"):
        return None
    return client_ssl_context(config.tls_ca_file, config.tls_cert_file,
                              check_hostname=getattr(config, "tls_check_hostname", True))


def client_ssl_context(ca_file: str | None, cert_file: str | None = None, *,
                       check_hostname: bool = True) -> ssl.SSLContext | None:
    """A client context when TLS is configured; the service's certificate (or CA) is the trust root.

    The service's certificate must name the host or IP address the client dials
    (subjectAltName), unless ``tls.checkHostname`` is off: for clusters whose
    certificates carry no addresses, where the pinned CA is the only identity check.
    """
    trust = ca_file or cert_file
    if not trust:
        return None
    setting = "tls.caFile" if ca_file else "tls.certFile"
    _check_readable(setting, trust)
    try:
        ctx = ssl.create_default_context(cafile=trust)
    except ssl.SSLError as exc:
        raise ConfigError(f"{setting} {trust} holds no PEM certificate to trust ({exc.reason or exc})") from None
    ctx.check_hostname = check_hostname
    return ctx


EVERYONE = "*"  # in an exchange's or stream's readers: every credential the service accepts


def may_read(readers: tuple[str, ...], owner: str, identity: str) -> bool:
    """Whether a credential may read what ``owner`` wrote for ``readers`` (the owner and the operator always may;
    with no authentication there is no credential, and every read is open)."""
    return not identity or identity in (OPERATOR, owner) or EVERYONE in readers or identity in readers
