"""Who may hold a connection before it proved the secret (sans-IO: this decides, the server closes).

A stranger is any connection that has not authenticated yet, except a client of this service's own
user on the Unix socket (``SO_PEERCRED``): that one is never counted with strangers, never closed to
make room for one and never refused because of them. Strangers are capped in all
(``maxUnauthenticatedConnections``) and per peer (``maxUnauthenticatedPerPeer``: an address for TCP,
a uid for the Unix socket). When a cap is full, the oldest stranger in it that has stayed silent for
:meth:`Admission.idle_after` seconds is closed to make room: a client sends its Hello one round trip
after connecting, so a full cap of idle strangers cannot keep anyone out. Only a cap full of strangers
that connected within that moment refuses the newcomer ("try again").

Once a connection has authenticated it counts against its credential: an application credential holds
at most ``maxConnectionsPerCredential`` at once (the operator's has no such cap), so one application
opening connections without end cannot keep the others, or the operator, out.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, Hashable, TypeVar

C = TypeVar("C", bound=Hashable)


def peer_of(sock: socket.socket | None, transport_kind: str, peername: object) -> tuple[str, bool]:
    """(the peer a connection counts against, whether it is this user's own client on the Unix socket)."""
    if transport_kind == "unix":
        try:
            _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  struct.calcsize("3i")))
        except (OSError, AttributeError):
            return "uid ?", False
        return f"uid {uid}", uid == os.getuid()
    if isinstance(peername, (tuple, list)) and peername:
        return str(peername[0]), False
    return str(peername), False


@dataclass
class Verdict(Generic[C]):
    """The answer to a new connection: refused (``refusal`` says why), or admitted after closing ``evict``."""

    refusal: str | None = None
    evict: list[tuple[C, str]] = field(default_factory=list)  # (connection, the message it is closed with)


class Admission(Generic[C]):
    """The service's connections, and which of them are strangers, oldest first."""

    def __init__(self, max_connections: int, max_strangers: int, max_per_peer: int, hello_timeout: float,
                 clock: Callable[[], float] = time.monotonic, notes: dict[str, str] | None = None,
                 max_per_credential: int | None = None, unlimited: str = "operator") -> None:
        """``notes``: key -> what its messages add after ``key=value`` (why the cap is lower than configured);
        ``max_per_credential``: connections one authenticated credential holds at once (None: no cap), except
        the ``unlimited`` one (the operator)."""
        self.notes = notes or {}
        self.max_per_credential = max_per_credential
        self.unlimited = unlimited
        self._per_credential: dict[str, int] = {}
        self._credential_of: dict[C, str] = {}
        self.max_connections = max_connections
        self.max_strangers = max_strangers
        self.max_per_peer = max_per_peer
        self.hello_timeout = hello_timeout
        self.clock = clock
        self.connections: set[C] = set()
        self.refused = 0  # newcomers refused so far
        self._strangers: OrderedDict[C, tuple[str, float]] = OrderedDict()  # -> (peer, admitted at)
        self._per_peer: dict[str, int] = {}

    @property
    def idle_after(self) -> float:
        """A stranger silent this long is idle (a tenth of the Hello timeout, at most a second)."""
        return min(1.0, self.hello_timeout / 10)

    @property
    def strangers(self) -> int:
        return len(self._strangers)

    def admit(self, conn: C, peer: str, trusted: bool) -> Verdict[C]:
        """Take ``conn`` from ``peer`` (``trusted``: this user's own client on the Unix socket)."""
        now = self.clock()
        evict: list[tuple[C, str]] = []
        gone: set[C] = set()
        while True:
            cap = self._full_cap(peer, trusted, gone)
            if cap is None:
                break
            key, limit, scope = cap
            victim = self._oldest_idle(now, scope, gone)
            if victim is None:  # nothing is closed for a newcomer that is refused
                self.refused += 1
                return Verdict(self._refusal(key, limit, peer))
            evict.append((victim, f"closed without a Hello after {now - self._strangers[victim][1]:.1f} s: "
                                  f"{self._cap(key, limit)} is reached and a newer connection took this one's place"))
            gone.add(victim)
        for victim in gone:
            self.discharge(victim)
        self.connections.add(conn)
        if not trusted:
            self._strangers[conn] = (peer, now)
            self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        return Verdict(None, evict)

    def _full_cap(self, peer: str, trusted: bool, gone: set[C]) -> tuple[str, int, str | None] | None:
        """The first cap ``conn`` would exceed once ``gone`` are closed: (key, limit, peer whose strangers
        may make room, None for any), or None."""
        if len(self.connections) - len(gone) >= self.max_connections:
            return "maxConnections", self.max_connections, None
        if trusted:
            return None
        if self._per_peer.get(peer, 0) - sum(self._strangers[c][0] == peer for c in gone) >= self.max_per_peer:
            return "maxUnauthenticatedPerPeer", self.max_per_peer, peer
        if len(self._strangers) - len(gone) >= self.max_strangers:
            return "maxUnauthenticatedConnections", self.max_strangers, None
        return None

    def _cap(self, key: str, limit: int) -> str:
        return f"{key}={limit}{self.notes.get(key, '')}"

    def _refusal(self, key: str, limit: int, peer: str) -> str:
        if key == "maxConnections":
            return f"too many connections: this service serves at most {self._cap(key, limit)}"
        whose = f" from {peer}" if key == "maxUnauthenticatedPerPeer" else ""
        return f"too many connections{whose} that have not authenticated yet ({self._cap(key, limit)}); try again"

    def authenticated(self, conn: C, credential: str = "") -> str | None:
        """``conn`` proved the secret of ``credential``: it is a stranger no more. Returns why it is refused
        when its credential holds as many connections as it may (it is then closed: call :meth:`discharge`)."""
        self._forget(conn)
        if not credential or credential == self.unlimited or self.max_per_credential is None:
            return None
        held = self._per_credential.get(credential, 0)
        if held >= self.max_per_credential:
            self.refused += 1
            return (f"too many connections of credential {credential!r}: it holds {held}, and one application "
                    f"credential may hold at most {self._cap('maxConnectionsPerCredential', self.max_per_credential)}"
                    "; close some (other credentials are not affected)")
        self._per_credential[credential] = held + 1
        self._credential_of[conn] = credential
        return None

    def connections_of(self, credential: str) -> int:
        return self._per_credential.get(credential, 0)

    def credentials(self) -> list[str]:
        """The capped credentials holding connections now."""
        return list(self._per_credential)

    def discharge(self, conn: C) -> None:
        """``conn`` is gone."""
        self._forget(conn)
        self.connections.discard(conn)
        credential = self._credential_of.pop(conn, None)
        if credential is not None:
            left = self._per_credential[credential] - 1
            if left:
                self._per_credential[credential] = left
            else:
                del self._per_credential[credential]

    def _oldest_idle(self, now: float, peer: str | None, gone: set[C]) -> C | None:
        for conn, (conn_peer, since) in self._strangers.items():  # oldest first
            if now - since < self.idle_after:
                return None  # every later one is younger still
            if conn not in gone and (peer is None or conn_peer == peer):
                return conn
        return None

    def _forget(self, conn: C) -> None:
        entry = self._strangers.pop(conn, None)
        if entry is not None:
            left = self._per_peer[entry[0]] - 1
            if left:
                self._per_peer[entry[0]] = left
            else:
                del self._per_peer[entry[0]]
