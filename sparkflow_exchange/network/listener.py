"""Accepting connections so that running out of file descriptors is a refusal, never a stuck service.

asyncio's own accept loop, on EMFILE, logs a traceback, stops accepting for a second and, in the
same turn, tries again up to its backlog, once per waiting client: a service at its fd limit wrote
megabytes of log per second and told no client anything. A :class:`Listener` accepts by itself and
keeps one fd in reserve (on ``/dev/null``): out of fds, it gives that one back, accepts the first
waiting client with it, sends it an error frame saying the service is out of file descriptors, closes
it, and takes the reserve again. Clients are told at once, and the service serves everyone else.

On a TLS port what a connection costs before it has said anything stays flat. A connection that has
sent no byte yet waits apart (it costs an fd and nothing else), until its first bytes start the TLS
handshake or the handshake deadline passes; a handshake that started runs under the same deadline. Both
together are capped (``max_handshakes``): a newcomer takes the place of the oldest connection still
silent (a TLS client speaks first, right after connecting, so silence is what idle floods look like),
else of the oldest handshake running for ``idle_after``; with neither, it is closed (the client asks
again with backoff, ``network/retry.py``). So idle connections reopened faster than any age rule
notices cannot keep a client out.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import ssl
from typing import Callable

from ..errors import ConfigError
from ..exhaustion import explain
from .protocol import ErrorResponse, encode_bytes

log = logging.getLogger(__name__)

BACKLOG = 1024  # pending connections the kernel queues (clipped to net.core.somaxconn)
_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
PAUSE = 0.05  # s without accepting when not even the reserve fd could be had back


def _first_bytes(conn: socket.socket) -> bool | None:
    """Whether a new connection has sent anything (peeked, not read): True; None when nothing yet; False
    when it hung up."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return False


def _reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


async def tcp_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets on every address ``host`` resolves to, all on one port (``port`` 0: a free one)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys((i[0], i[1], i[2], i[3], i[4]) for i in infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:  # the others on the first one's ephemeral port
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as exc:  # e.g. the port is taken: one line naming the address, no traceback
                where = f"[{address[0]}]:{address[1]}" if family == socket.AF_INET6 else f"{address[0]}:{address[1]}"
                raise ConfigError(f"cannot listen on {where}: {exc.strerror or exc}") from None
            sock.listen(BACKLOG)
    except (OSError, ConfigError):
        for sock in socks:
            sock.close()
        raise
    return socks


def unix_socket(path: str, group: bool = False) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from its creation (only this user may connect); with
    ``group``, 0660 (its group may connect too: applications of other users sharing the service's group).
    Never more: others may not connect, whatever the directory allows.

    Only a stale socket (one nobody listens on, left by a service that was killed) is replaced there;
    anything else at ``path`` is a ConfigError naming it (a careless ``--unix`` must not delete a file)."""
    remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o117 if group else 0o177)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(BACKLOG)
    return sock


def remove_stale_socket(path: str) -> None:
    """Remove a socket nobody listens on at ``path``; ConfigError if anything else is there."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode)
                else "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket")
        raise ConfigError(f"the Unix socket path {path} exists and is {kind}, not a socket: the service replaces "
                          "only a stale socket there (remove it, or choose another --unix path)")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            pass  # stale: nobody listens
        except OSError as exc:
            raise ConfigError(f"the Unix socket path {path} cannot be checked ({exc.strerror or exc}); remove it "
                              "if no service uses it") from None
        else:
            raise ConfigError(f"the Unix socket path {path} has a process listening on it (another service?); "
                              "stop it, or choose another --unix path")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Listener:
    """Accepts on one listening socket and hands each connection to a protocol made by ``factory``."""

    def __init__(self, sock: socket.socket, factory: Callable[[], asyncio.BaseProtocol], *,
                 ssl_ctx: ssl.SSLContext | None = None, handshake_timeout: float | None = None,
                 plain: bool = False, max_handshakes: int = 64, idle_after: float = 1.0) -> None:
        """``plain``: not our protocol (the metrics' HTTP): a client refused for want of fds is only closed.
        With TLS, at most ``max_handshakes`` connections are silent or in their handshake at once, each for
        at most ``handshake_timeout`` s; a newcomer takes the place of the oldest silent one, else of the
        oldest handshake running for ``idle_after`` s, else it is closed (as strangers are)."""
        self.plain = plain
        self.max_handshakes = max_handshakes
        self.idle_after = idle_after
        self._handshakes: dict[asyncio.Task, float] = {}  # TLS handshakes running, oldest first -> started
        # connections that have sent nothing yet (TLS only), oldest first -> their deadline's timer
        self._silent: dict[socket.socket, asyncio.TimerHandle] = {}
        self.sock = sock
        self.factory = factory
        self.ssl_ctx = ssl_ctx
        self.handshake_timeout = handshake_timeout
        self.refused = 0  # connections turned away for want of fds (or of room for a TLS handshake)
        self.loop = asyncio.get_running_loop()
        self._reserve = _reserve()
        self._closed = False
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._on_readable)

    def getsockname(self):
        return self.sock.getsockname()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for conn in list(self._silent):
            self._drop_silent(conn)
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def _on_readable(self) -> None:
        for _ in range(64):  # then let the loop serve the others
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _OUT_OF:
                    self._shed(exc)
                else:
                    log.warning("accepting a connection failed: %s", exc)
                return
            conn.setblocking(False)
            if self.ssl_ctx is None:
                self.loop.create_task(self._serve(conn))
                continue
            if not self._make_room():
                self.refused += 1
                conn.close()  # before TLS nothing can be said to it: it sees the close (a flood of fresh handshakes)
                continue
            said = _first_bytes(conn)
            if said is None:
                self._wait_silent(conn)
            elif said:
                self._start_handshake(conn)
            else:  # it hung up already
                conn.close()

    @property
    def pending(self) -> int:
        """TLS connections not served yet: silent, or in their handshake."""
        return len(self._silent) + len(self._handshakes)

    def _make_room(self) -> bool:
        """Room for one more pre-TLS connection: the oldest silent one goes, else the oldest handshake that
        has run for idle_after; False when neither (every place is a handshake started just now)."""
        if self.pending < self.max_handshakes:
            return True
        if self._silent:
            self._drop_silent(next(iter(self._silent)))
            return True
        oldest, started = next(iter(self._handshakes.items()))
        if self.loop.time() - started < self.idle_after:
            return False
        oldest.cancel()  # asyncio closes its transport
        del self._handshakes[oldest]
        return True

    def _wait_silent(self, conn: socket.socket) -> None:
        deadline = self.handshake_timeout if self.handshake_timeout is not None else 60.0
        self._silent[conn] = self.loop.call_later(deadline, self._drop_silent, conn)
        self.loop.add_reader(conn.fileno(), self._on_first_bytes, conn)

    def _on_first_bytes(self, conn: socket.socket) -> None:
        if conn not in self._silent:
            return
        said = _first_bytes(conn)
        if said is None:  # woken with nothing to read after all: still silent
            return
        self.loop.remove_reader(conn.fileno())
        self._silent.pop(conn).cancel()
        if said:
            self._start_handshake(conn)
        else:  # it hung up: nothing to serve
            conn.close()

    def _drop_silent(self, conn: socket.socket) -> None:
        timer = self._silent.pop(conn, None)
        if timer is None:
            return
        timer.cancel()
        try:
            self.loop.remove_reader(conn.fileno())
        except (ValueError, OSError):
            pass
        conn.close()

    def _start_handshake(self, conn: socket.socket) -> None:
        task = self.loop.create_task(self._serve(conn))
        self._handshakes[task] = self.loop.time()
        task.add_done_callback(lambda done: self._handshakes.pop(done, None))

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn, ssl=self.ssl_ctx,
                                                    ssl_handshake_timeout=self.handshake_timeout)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, asyncio.CancelledError) as exc:
            log.info("a connection failed before it was served: %r", exc)
            conn.close()

    def _shed(self, exc: OSError) -> None:
        """Out of fds: refuse the first waiting client with the reserved fd, or pause if it is not back yet."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                conn = None
            if conn is not None:
                self.refused += 1
                log.warning("%s (%d connections refused so far)", explain(exc, "refusing a connection"), self.refused)
                if self.ssl_ctx is None and not self.plain:  # a TLS client expects a handshake: it sees the close
                    try:
                        conn.setblocking(False)
                        conn.send(encode_bytes(ErrorResponse(explain(exc, "connection refused"), None, True,
                                                             "too_many_connections")))
                    except OSError:
                        pass
                conn.close()
            self._reserve = _reserve()
        if self._reserve is None and not self._closed:  # still none: wait for fds instead of spinning
            self.loop.remove_reader(self.sock.fileno())
            self.loop.call_later(PAUSE, self._resume)

    def _resume(self) -> None:
        if self._closed:
            return
        if self._reserve is None:
            self._reserve = _reserve()
        self.loop.add_reader(self.sock.fileno(), self._on_readable)
