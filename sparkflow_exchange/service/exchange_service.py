"""The exchange service: holds result partitions and serves them (Flink's TaskManager network environment).

One asyncio process per host (or per executor), listening on TCP and on a
Unix domain socket. It may also carry the coordinator role. Everything runs
on one event loop; spill-file I/O is plain pread/pwrite on that loop, which the
page cache makes cheap.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ..config import ExchangeConfig
from ..errors import ErrorCode, ServiceError
from ..exhaustion import nofile_limit
from ..kinds import PARTITION_TYPES
from ..network import auth
from ..network.admission import Admission
from ..network.advertised import WILDCARDS, Advertised, advertised_host
from ..network.listener import Listener, tcp_sockets, unix_socket
from ..network.protocol import FRAME_POOL, RegisterPartition
from ..network.rpc import MAX_ID_LENGTH
from ..network.server import ServerConnection
from ..partition.buffer_pool import SUBPARTITION_BYTES, MemoryAccount, NetworkBufferPool
from ..partition.result_partition import ResultPartition
from ..partition.spill import DiskBudget, DiskShare, SpillReaders
from . import owners, spill_root
from .coordinator import Coordinator
from .exchanges import checked_readers
from .fd_budget import fd_budget
from .launcher import pid_alive
from .releases import PartitionReleases
from .rpc_handlers import Dispatcher
from .service_status import service_status
from .streams import StreamRegistry

log = logging.getLogger(__name__)



class ExchangeService:
    def __init__(self, config: ExchangeConfig, *, coordinator: bool = True, unix_path: str | None = None,
                 secret: str | None = None, attach_mode: bool = False, hold_exchanges: bool = False,
                 retire: Callable[[], bool] | None = None, serve_metrics: bool = False,
                 driver_host: str | None = None) -> None:
        """``attach_mode``: exit once no attached application lives (for ``embedded.idleTimeout``);
        ``hold_exchanges``: not while it still holds an exchange or partition; ``retire``: asked before
        such an exit, may refuse it (the launcher's lock: a client is joining at that moment);
        ``driver_host``: Spark's ``spark.driver.host`` when it runs with the driver (an address to advertise);
        ``serve_metrics``: serve Prometheus metrics even with ``metricsPort`` 0, on an ephemeral port (the
        Spark plugin's gauges read them)."""
        self.serve_metrics = serve_metrics
        self.config = config
        self.service_id = f"svc-{uuid.uuid4().hex[:8]}"
        self.host_id = config.resolved_host_id()
        self.secret = secret if secret is not None else config.service_secret()
        # the operator's (its secret) and the application credentials it accepts (service/owners.py)
        self.credentials = owners.load_credentials(config.credentials_file, self.secret)
        # a bad TLS file or half the settings: an error before anything is made (never plaintext instead)
        self.ssl_ctx = auth.server_ssl_context(config.tls_cert_file, config.tls_key_file)
        self.budget = NetworkBufferPool(config.memory_budget)  # every partition's pool draws on it
        self.fds = fd_budget(config, nofile_limit())  # the caps below, lowered to fit the open-file limit
        self.spill_readers = SpillReaders(self.fds.spill_reads)  # fds of finished spill files
        # idle receive buffers kept for reuse are memory outside the budget: a small budget keeps few
        FRAME_POOL.max_bytes = min(FRAME_POOL.max_bytes, max(4 << 20, config.memory_budget // 8))
        # the spill root (spillDir, else the temp directory) is shared; our files go into a directory of our
        # own in it, locked while we live, so a later service removes it if we are killed (spill_root.py)
        self.spill_root = Path(config.spill_dir or tempfile.gettempdir())
        # directories we made (0700) above our own, removed when we stop if nothing else is in them
        self._made_dirs = [] if config.spill_dir is None else _make_private_dirs(self.spill_root)
        swept = spill_root.sweep(self.spill_root)  # what dead services of this root left
        if swept.removed:
            log.info("removed %d spill directories of dead services under %s", len(swept.removed), self.spill_root)
        for path, nbytes in swept.left.items():
            log.warning("a dead service's spill directory %s (%d bytes) could not be removed: it counts against "
                        "maxDiskBytes until it is gone", path, nbytes)
        self.leftover = swept.left  # dead services' directories we could not remove -> bytes still in them
        self.home = spill_root.SpillHome(self.spill_root)
        self.spill_dir = self.home.path
        self.own_files: list[Path] = []  # files it made (its Unix socket, a generated secret), removed when it stops
        # exchanges outlive their writers: the spill files' bound (maxDiskBytes, else 90% of the free space);
        # what dead services left and we could not remove takes its share of it
        self.disk = DiskBudget(config.max_disk_bytes or int(shutil.disk_usage(self.spill_dir).free * 0.9))
        self.disk.used = sum(self.leftover.values())
        self.partitions: dict[str, ResultPartition] = {}
        # each application credential's share of memory.budget and of the disk bound (the operator has none)
        self.memory_accounts: dict[str, MemoryAccount] = {}
        self.disk_shares: dict[str, DiskShare] = {}
        # every connection, and the strangers among them (not authenticated, not our own user's Unix clients)
        self.admission: Admission[ServerConnection] = Admission(
            self.fds.connections, self.fds.strangers, self.fds.strangers_per_peer, config.hello_timeout,
            notes=self.fds.notes, max_per_credential=min(config.max_connections_per_credential, self.fds.connections),
            unlimited=auth.OPERATOR)
        self.connections = self.admission.connections
        # payload bytes consumers read, by path: served over a Unix/TCP connection from a reader on this
        # host ("local"; "local_shared" of it were copied by the reader out of a writer's shared-memory
        # slot) or another ("remote"), or read by a reader on this host from our spill files
        self.traffic = {"local": 0, "local_shared": 0, "remote": 0, "local_file": 0}
        self.releases = PartitionReleases(self)  # freeing partitions here, or asking the service holding them
        self.coordinator = Coordinator(
            self.releases.release, config.ttl, config.heartbeat_timeout,
            partition_owner=lambda location, pid: self._partition_owner(pid)
            if location.get("service_id") == self.service_id else None,
            max_exchanges_per_owner=config.max_exchanges_per_credential,
            lost_retention=config.lost_service_retention) if coordinator else None
        if self.coordinator is not None:
            self.coordinator.writes.default_readers = checked_readers(config.default_readers)
        # a reader query that never planned a batch: its group goes after declareTimeout (at most 30 s) idle
        self.streams = StreamRegistry(self.coordinator, config.ttl, min(30.0, config.declare_timeout),
                                      max_groups_per_owner=config.max_groups_per_credential) \
            if self.coordinator is not None else None
        self.dispatcher = Dispatcher(self)  # each RPC's handler, as the RPC table names it
        self.unix_path = unix_path
        self.attach_mode = attach_mode  # embedded: exit when the attached applications are gone
        self.hold_exchanges = hold_exchanges  # ... and it holds nothing more
        self.retire = retire
        self.apps: dict[str, int] = {}  # application id -> pid of its JVM
        self.listeners: list[Listener] = []
        self.tcp_address: tuple[str, int] | None = None
        self.driver_host = driver_host
        self.advertised: Advertised | None = None  # the address others reach the TCP listener at
        self.started = time.monotonic()
        self.last_app_seen = time.monotonic()
        self.stopping: asyncio.Event | None = None
        self.metrics_server: Any = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # before anyone learns our address: a stop is always clean
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):
                pass
        ssl_ctx = self.ssl_ctx
        for sock in await tcp_sockets(self.config.bind_host, self.config.port):
            # TLS handshakes run before a stranger is counted: they are capped and made room among alike
            self.listeners.append(Listener(sock, lambda: ServerConnection(self, "tcp"), ssl_ctx=ssl_ctx,
                                           handshake_timeout=self.config.hello_timeout if ssl_ctx else None,
                                           max_handshakes=self.fds.strangers, idle_after=self.admission.idle_after))
        self.tcp_address = self.listeners[0].getsockname()[:2]
        bound = self.config.bind_host if self.config.bind_host in WILDCARDS else self.tcp_address[0]
        self.advertised = advertised_host(bound, family=self.listeners[0].sock.family, setting=self.config.advertised_host,
                                          coordinator=self.config.coordinator, driver_host=self.driver_host)
        log.info("advertising %s (%s)", self.advertised.with_port(self.tcp_address[1]), self.advertised.source.value)
        if self.unix_path is None:
            self.unix_path = str(self.spill_dir / "service.sock")
        self.listeners.append(Listener(unix_socket(self.unix_path, group=self.config.unix_socket_group), lambda: ServerConnection(self, "unix")))
        self.own_files.append(Path(self.unix_path))  # ours now: removed when it stops
        if self.config.metrics_port or self.serve_metrics:
            from .metrics import start_metrics_server

            self.metrics_server = await start_metrics_server(self.status, self.config.metrics_host,
                                                           self.config.metrics_port,
                                                           timeout=self.config.metrics_timeout,
                                                           max_connections=self.config.metrics_max_connections)
        asyncio.ensure_future(self._housekeeping())
        if self.coordinator is not None:  # its own partitions are in the registry too (status, a restart)
            self._register_self()
        elif self.config.coordinator:
            from .heartbeat import report_to_coordinator

            # ready once registered (or the first try failed): the coordinator refuses producers of a service
            # it does not know, and a writer may come as soon as our address is out
            first = loop.create_future()
            reporting = asyncio.ensure_future(report_to_coordinator(self, self.config.coordinator, first))
            await asyncio.wait([first, reporting], return_when=asyncio.FIRST_COMPLETED)

    def _register_self(self) -> None:
        a = self.addresses()
        self.coordinator.services.register(self.service_id, self.host_id, a["tcp"], a["unix"], a["pid"])

    def addresses(self) -> dict[str, Any]:
        port = self.tcp_address[1] if self.tcp_address else 0
        return {
            "tcp": self.advertised.with_port(port) if self.advertised else f":{port}",
            "unix": f"unix:{self.unix_path}",
            "host_id": self.host_id,
            "service_id": self.service_id,
            "pid": os.getpid(),
            "coordinator": self.coordinator is not None,
            # started for applications (embedded, the plugin's: exits with them) or by the operator (`serve`)
            "attached": self.attach_mode,
            "reports_to": "" if self.coordinator is not None else self.config.coordinator or "",
            "tls": bool(self.config.tls_cert_file),
            "metrics_port": self.metrics_server.port if self.metrics_server else 0,
            "spill_dir": str(self.spill_dir),
        }

    async def serve_until_stopped(self) -> None:
        await self.stopping.wait()
        await self.shutdown()

    def stop(self) -> None:
        if self.stopping is not None:
            self.stopping.set()

    async def shutdown(self) -> None:
        for listener in self.listeners:
            listener.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for part in list(self.partitions.values()):
            part.release("the service shut down")
        self.partitions.clear()
        if self.metrics_server is not None:
            self.metrics_server.close()
        for path in self.own_files:  # never what was at --unix before (a start that failed there)
            path.unlink(missing_ok=True)
        self.home.remove()
        for made in reversed(self._made_dirs):  # our files are gone with their partitions; others' stay
            try:
                made.rmdir()
            except OSError:
                break

    async def _housekeeping(self) -> None:
        while not self.stopping.is_set():
            await asyncio.sleep(0.5)
            if self.coordinator is not None:
                # a write left open by an application that is gone would keep an embedded service up for good
                await self.coordinator.expire(abandoned_writes=self.hold_exchanges and not self.apps)
                await self.streams.expire()
                self.coordinator.services.heartbeat(self.service_id)
                await self.coordinator.check_services()
            self._expire_partitions()
            if self.attach_mode and self._apps_gone() and not (self.hold_exchanges and self.holds_data()) \
                    and (self.retire is None or self.retire()):
                log.info("no attached application is alive and no exchange is held; the service exits")
                self.stop()

    def holds_data(self) -> bool:
        """An exchange, a stream or a partition lives here: an embedded service keeps it for later readers.
        (A failed partition outside any exchange, left by a writer killed as it joined, is no reason.)"""
        if any(part.failure is None for part in self.partitions.values()):
            return True
        return self.coordinator is not None and bool(self.coordinator.exchanges or self.streams.streams)

    def _expire_partitions(self) -> None:
        """A service without the coordinator frees partitions nobody touched for ``ttl``; one that reports to
        a coordinator leaves that to it (it releases them when their exchange is dropped or expires)."""
        if self.coordinator is not None or self.config.coordinator or self.config.ttl <= 0:
            return
        now = time.monotonic()
        for pid, part in list(self.partitions.items()):
            if part.finished and now - part.created > self.config.ttl and not any(s.views for s in part.subpartitions):
                self.release_partition(pid, f"expired (unused for ttl={self.config.ttl:g} s)")

    def _apps_gone(self) -> bool:
        alive = {app: pid for app, pid in self.apps.items() if pid_alive(pid)}
        self.apps = alive
        if alive:
            self.last_app_seen = time.monotonic()
            return False
        return time.monotonic() - self.last_app_seen > self.config.idle_timeout

    # ------------------------------------------------------------ partitions
    def register_partition(self, msg: RegisterPartition, owner: str = auth.OPERATOR) -> ResultPartition:
        """Take a writer's partition; ``owner``: the credential its connection proved (only that one or the
        operator may release it or join it to an exchange: ``service/owners.py``)."""
        if msg.partition_type not in PARTITION_TYPES:
            raise ValueError(f"unknown partition type {msg.partition_type!r}; use one of {', '.join(PARTITION_TYPES)}")
        for field, value in (("partition", msg.partition), ("exchange", msg.exchange), ("attempt", msg.attempt),
                             ("shm_path", msg.shm_path)):
            if len(value) > MAX_ID_LENGTH:  # as an RPC's identifiers: every later call can still name it
                raise ValueError(f"the {field} of a RegisterPartition is {len(value)} characters long; at most "
                                 f"{MAX_ID_LENGTH} are taken")
        if not msg.partition:
            raise ValueError("a RegisterPartition needs a partition id")
        if msg.partition in self.partitions:
            raise ValueError(f"partition {msg.partition!r} is already registered")
        if not 1 <= msg.num_subpartitions <= 1 << 16:
            raise ValueError(f"numSubpartitions {msg.num_subpartitions} is out of range 1..65536")
        if msg.buffer_size < 0 or msg.buffer_size > self.config.max_frame_size // 2 or msg.buffers < 0:
            raise ValueError(f"bad pool request: {msg.buffers} buffers of {msg.buffer_size} bytes")
        account, disk = self.shares_of(owner)
        if account is not None:  # before a subpartition is made: a wide partition costs memory unwritten
            bounded = msg.partition_type == "PIPELINED_BOUNDED"
            need = msg.num_subpartitions * SUBPARTITION_BYTES + (0 if bounded else
                                                                 msg.buffer_size or self.config.buffer_size)
            if need > account.room:
                raise ServiceError(
                    f"partition {msg.partition!r} of {msg.num_subpartitions} subpartitions is refused: it needs {need} "
                    f"bytes of memory before any row ({SUBPARTITION_BYTES} per subpartition"
                    f"{'' if bounded else ' and a receive buffer'}), and {account.describe()}; finish or drop "
                    "its other writes, or write fewer subpartitions", ErrorCode.LIMIT)
        part = ResultPartition(
            msg.partition, msg.num_subpartitions, msg.partition_type, self.budget,
            msg.buffers or self.config.buffers_per_partition, msg.buffer_size or self.config.buffer_size,
            self.spill_dir, exchange=msg.exchange, attempt=msg.attempt, spill_readers=self.spill_readers,
            disk=disk, account=account,
        )
        part.owner = owner
        self.partitions[msg.partition] = part
        return part

    def shares_of(self, owner: str) -> tuple[MemoryAccount | None, DiskBudget | DiskShare]:
        """The memory account and disk bound a credential's partitions draw on: its shares of the service's
        (``credentialMemoryShare``, ``credentialDiskShare``); the operator's are the whole budget and disk."""
        if owner == auth.OPERATOR or not owner:
            return None, self.disk
        account = self.memory_accounts.get(owner)
        if account is None:
            account = self.memory_accounts[owner] = MemoryAccount(
                owner, int(self.budget.total_bytes * self.config.credential_memory_share))
            self.disk_shares[owner] = DiskShare(self.disk, owner, int(self.disk.limit * self.config.credential_disk_share))
        return account, self.disk_shares[owner]

    def producer_lost(self, part: ResultPartition, reason: str) -> None:
        self.releases.producer_lost(part, reason)

    def release_partition(self, pid: str, reason: str = "released by the coordinator",
                          code: ErrorCode = ErrorCode.RELEASED) -> bool:
        return self.releases.release_partition(pid, reason, code)

    def release_unknown(self, known: set[str], coordinator: str) -> list[str]:
        return self.releases.release_unknown(known, coordinator)

    def _partition_owner(self, partition: str) -> str:
        part = self.partitions.get(partition)
        return part.owner if part is not None else ""

    def admit(self, conn: ServerConnection) -> str | None:
        """Take a new connection, or say why not; idle strangers make room (``network/admission.py``)."""
        verdict = self.admission.admit(conn, conn.peer_key, conn.trusted)
        for victim, message in verdict.evict:
            victim.fatal(message, code=ErrorCode.TOO_MANY_CONNECTIONS)
        return verdict.refusal

    def authenticated(self, conn: ServerConnection) -> str | None:
        return self.admission.authenticated(conn, conn.identity)

    def discharge(self, conn: ServerConnection) -> None:
        self.admission.discharge(conn)

    def on_connection_closed(self, conn: ServerConnection) -> None:
        for unsubscribe in conn.subscriptions.values():
            unsubscribe()
        conn.subscriptions.clear()

    # ------------------------------------------------------------ rpc
    async def rpc(self, conn: ServerConnection, method: str, args: dict) -> Any:
        """Answer a request the server checked against the RPC table (its row names the handler)."""
        return await self.dispatcher.call(conn, method, args)

    def status(self) -> dict[str, Any]:
        """Everything the service holds and serves, for ``status``, the CLI and the metrics (service_status.py)."""
        return service_status(self)


def _make_private_dirs(path: Path) -> list[Path]:
    """Create ``path`` and any missing parents with mode 0700; the ones made, outermost first."""
    missing = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing.append(p)
    made = []
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            continue
        made.append(p)
    return made

