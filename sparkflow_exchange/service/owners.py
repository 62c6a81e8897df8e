"""Owners: who may change what (docs/deployment.md, "Credentials and owners").

A service accepts its own secret, the *operator* credential, and the application credentials of its
``credentialsFile``; a connection is whichever credential it proved in the handshake. An exchange (or
stream) belongs to the credential that declared it. Only its owner or the operator may write it
(overwrite, append, register producers, finish, commit, abort) or drop it; a consumer group belongs to
the credential that joined (created) it, and only that one, the stream's owner or the operator may
move, commit or leave it; a partition belongs to the credential that registered it on its service, and
only that one or the operator may release it or join it to an exchange. Operations on the whole
service (stopping it, attaching applications to its lifetime, its registry of services) need the
operator. Reading, listing and describing are open to every credential the service accepts. The RPC
table (``network/rpc.py``) says which rule each method follows. With one secret there is only the
operator, and everything behaves as without owners. Sans-IO: the service asks :func:`check` before it
acts on a request.
"""
from __future__ import annotations

from typing import Any, Protocol

from ..config import ConfigError, read_protected_file
from ..errors import ErrorCode, ServiceError
from ..network.auth import OPERATOR, may_read
from ..network.rpc import RPCS, Who

FORBIDDEN = ErrorCode.FORBIDDEN

class Holdings(Protocol):
    """Who owns what the service holds ("" for nothing of that name, or nobody's)."""

    def owner_of(self, name: str) -> str:
        """The credential an exchange or stream (or a stream's epoch) belongs to."""

    def group_owner(self, stream: str, group: str) -> tuple[str, str]:
        """(the credential a stream's consumer group belongs to, the stream's owner)."""

    def partition_owner(self, partition: str) -> str:
        """The credential that registered a partition this service holds."""

    def readers_of(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        """(owner, readers) of an exchange or stream (or a stream's epoch); None when there is none of that name."""


def check(identity: str, method: str, args: dict[str, Any], held: Holdings) -> None:
    """Refuse (``forbidden``) a request its connection's credential may not make (the RPC table's
    :class:`Who`); say what it touched and whose it is."""
    if identity == OPERATOR:
        return
    row = RPCS[method]
    who = row.who
    if who is Who.ANY:
        return
    if who is Who.OPERATOR:
        raise ServiceError(f"{row.doing or method} needs the operator credential (the service's own "
                           f"secret); this connection authenticated as {identity!r}", FORBIDDEN)
    if who is Who.OWNER:
        name = args.get("name")
        owner = held.owner_of(name) if isinstance(name, str) else ""
        if owner and owner != identity:
            raise ServiceError(f"{row.doing} exchange {name!r} is refused: it belongs to credential {owner!r} "
                               f"and this connection authenticated as {identity!r}; only its owner or the operator "
                               "may write, drop or release it", FORBIDDEN)
    elif who is Who.READER:
        check_reader(identity, args.get("name"), held, row.doing)
    elif who is Who.GROUP:
        name, group = args.get("name"), args.get("group")
        if method == "stream_join":  # joining a group reads the stream: its readers only, whoever owns the group
            check_reader(identity, name, held, "joining a consumer group of")
        if not (isinstance(name, str) and isinstance(group, str)):
            return  # a new group of its own (stream_join without one)
        owner, stream_owner = held.group_owner(name, group)
        if owner and identity not in (owner, stream_owner):
            raise ServiceError(f"{row.doing} consumer group {group!r} of stream {name!r} is refused: the "
                               f"group belongs to credential {owner!r} and this connection authenticated as "
                               f"{identity!r}; read with a consumerGroup of your own (only the group's owner, the "
                               "stream's owner or the operator may move, commit or leave it)", FORBIDDEN)
    elif who is Who.PARTITIONS:
        names = args.get("partitions") if "partitions" in args else [args.get("partition")]
        for pid in names if isinstance(names, list) else ():
            owner = held.partition_owner(pid) if isinstance(pid, str) else ""
            if owner and owner != identity:
                raise ServiceError(f"{row.doing} partition {pid!r} is refused: it was registered by "
                                   f"credential {owner!r} and this connection authenticated as {identity!r}; only "
                                   "the credential that registered it or the operator may", FORBIDDEN)


def check_reader(identity: str, name: Any, held: Holdings, doing: str = "reading") -> None:
    """Refuse (``forbidden``) a read of an exchange or stream whose owner did not name this credential among its
    readers; a name that is not held is left to the handler (it says there is none, or waits for it)."""
    found = held.readers_of(name) if isinstance(name, str) else None
    if found is None:
        return
    owner, readers = found
    if not may_read(readers, owner, identity):
        raise ServiceError(f"{doing} {name!r} is refused: its owner, credential {owner!r}, lets "
                           f"{', '.join(repr(r) for r in readers) or 'no other credential'} read it, and this connection "
                           f"authenticated as {identity!r}; ask the owner to write it with readers naming it",
                           FORBIDDEN)


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
