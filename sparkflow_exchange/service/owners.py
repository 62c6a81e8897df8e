"""Owners: who may change what (docs/deployment.md, "Credentials and owners").

A service accepts its own secret, the *operator* credential, and the application credentials of its
``credentialsFile``; a connection is whichever credential it proved in the handshake. An exchange (or
stream) belongs to the credential that declared it. Only its owner or the operator may write it
(overwrite, append, register producers, finish, commit, abort) or drop it; operations on the whole
service (stopping it, releasing partitions by id, attaching applications to its lifetime) need the
operator. Reading, listing and describing are open to every credential the service accepts. With one
secret there is only the operator, and everything behaves as without owners. Sans-IO: the service
asks :func:`check` before it acts on a request.
"""
from __future__ import annotations

from typing import Any, Callable

from ..config import ConfigError, read_protected_file
from ..network.auth import OPERATOR
from ..errors import ErrorCode, ServiceError

FORBIDDEN = ErrorCode.FORBIDDEN

# operations on the whole service: what each one is, for the refusal
SERVICE_WIDE = {"shutdown": "stopping the service", "release_partitions": "releasing partitions by id",
                "attach_app": "attaching an application to the service's lifetime",
                "register_service": "registering an exchange service", "service_heartbeat": "an exchange service's heartbeat"}
# operations that change one exchange or stream (``name``): its owner's or the operator's
CHANGES = {"declare": "writing", "register_producer": "writing", "producer_finished": "writing",
           "producer_failed": "writing", "commit": "committing a write of", "abort": "aborting a write of",
           "drop": "dropping", "stream_declare": "writing", "stream_begin_epoch": "writing",
           "stream_commit_epoch": "committing an epoch of", "stream_abort_epoch": "aborting an epoch of"}


def check(identity: str, method: str, args: dict[str, Any], owner_of: Callable[[str], str]) -> None:
    """Refuse (``forbidden``) a request its connection's credential may not make; say whose it is."""
    if identity == OPERATOR:
        return
    if method in SERVICE_WIDE:
        raise ServiceError(f"{SERVICE_WIDE[method]} needs the operator credential (the service's own secret); this "
                       f"connection authenticated as {identity!r}", FORBIDDEN)
    if method in CHANGES:
        name = args.get("name")
        owner = owner_of(name) if isinstance(name, str) else ""
        if owner and owner != identity:
            raise ServiceError(f"{CHANGES[method]} exchange {name!r} is refused: it belongs to credential {owner!r} "
                           f"and this connection authenticated as {identity!r}; only its owner or the operator "
                           "may write, drop or release it", FORBIDDEN)


def load_credentials(path: str | None, operator_secret: str | None) -> dict[str, str]:
    """name -> secret of every credential the service accepts: the operator's (its secret) and the file's.

    The file holds one ``name secret`` per line (blank lines and ``#`` comments aside). No secret at all
    means no authentication (an empty table)."""
    if not operator_secret:
        if path:
            raise ConfigError(f"credentialsFile {path} needs a service secret too (secret or secretFile): it is "
                              "the operator credential, the only one that may stop the service")
        return {}
    table = {OPERATOR: operator_secret}
    if not path:
        return table
    lines = read_protected_file(path, "credentialsFile", group_may_read=False,
                                why_private="it holds every application's secret").splitlines()
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        where = f"credentialsFile {path}, line {number}"
        if len(parts) != 2:
            raise ConfigError(f"{where}: expected 'name secret', got {len(parts)} fields")
        name, secret = parts
        if name == OPERATOR:
            raise ConfigError(f"{where}: {OPERATOR!r} is the name of the service's own secret; choose another")
        if name in table:
            raise ConfigError(f"{where}: credential {name!r} is listed twice")
        if secret in table.values():
            raise ConfigError(f"{where}: credential {name!r} has the same secret as another credential (the "
                              "service could not tell them apart)")
        table[name] = secret
    return table
