"""The service's answers to RPCs, found through the RPC table (``network/rpc.py``): one row per RPC names
its arguments, who may call it and its handler (``"<role>.<method>"``); :class:`Dispatcher` looks the
handler up once and calls it with the checked arguments, giving it the connection's credential
(``owner``) or the connection (``conn``) when it takes them. The handlers of the service itself and the
coordinator's answers that need the connection are here; the rest are the coordinator's and the stream
registry's own methods.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import ErrorCode, ServiceError
from ..network import auth
from ..network.rpc import RPCS
from . import owners
from .exchanges import checked_readers

if TYPE_CHECKING:
    from ..config import ExchangeConfig
    from ..network.server import ServerConnection
    from ..partition.result_partition import ResultPartition
    from .coordinator import Coordinator
    from .releases import PartitionReleases
    from .streams import StreamRegistry

# subscriptions one connection holds at once (a reader holds one per exchange it is reading): each costs the
# coordinator a callback, and every event of its exchange a notification, so a client cannot grow its memory without
# end; one credential holds at most as many over all its connections (the operator: no bound)
MAX_SUBSCRIPTIONS = 4096
SERVICE_GIVEN = frozenset({"owner", "conn"})  # a handler's arguments the service gives, never the client


class Service(Protocol):
    """What the handlers use of the exchange service (``exchange_service.py``)."""

    service_id: str
    coordinator: Coordinator | None
    streams: StreamRegistry | None
    apps: dict[str, int]
    last_app_seen: float
    partitions: dict[str, ResultPartition]
    traffic: dict[str, int]
    secret: str | None
    config: ExchangeConfig
    releases: PartitionReleases
    connections: set[ServerConnection]

    def addresses(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def stop(self) -> None: ...



class ServiceHoldings:
    """Who owns what the service holds (``owners.Holdings``): what the RPC table's :class:`Who` is checked on."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def owner_of(self, name: str) -> str:
        """The credential an exchange or stream (or a stream's epoch) of that name belongs to ("" if none)."""
        if self.service.coordinator is None:
            return ""
        ex = self.service.coordinator.exchanges.get(name)
        if ex is not None and not ex.stream:
            return ex.owner
        st = self.service.streams.streams.get(ex.stream if ex is not None else name)
        if st is not None:
            return st.owner
        lost = self.service.coordinator.lost.get(name)
        return lost.get("owner", "") if lost is not None else ""

    def group_owner(self, stream: str, group: str) -> tuple[str, str]:
        """(the credential a consumer group belongs to, its stream's owner); ("", "") for none."""
        st = self.service.streams.streams.get(stream) if self.service.streams is not None else None
        g = st.groups.get(group) if st is not None else None
        return (g.owner, st.owner) if g is not None else ("", "")

    def partition_owner(self, partition: str) -> str:
        part = self.service.partitions.get(partition)
        return part.owner if part is not None else ""

    def readers_of(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        if self.service.coordinator is None:
            return None
        ex = self.service.coordinator.exchanges.get(name)
        if ex is not None and not ex.stream:
            return ex.owner, ex.readers
        st = self.service.streams.streams.get(ex.stream if ex is not None else name)
        return (st.owner, st.readers) if st is not None else None


class ServiceCalls:
    """RPCs every service answers."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def ping(self) -> dict[str, Any]:
        return self.service.addresses()

    def status(self) -> dict[str, Any]:
        return self.service.status()

    def shutdown(self) -> dict:
        asyncio.get_running_loop().call_later(0.05, self.service.stop)
        return {"ok": True}

    def release_partitions(self, conn: ServerConnection, partitions: list[str], reason: str | None = None,
                           code: str = ErrorCode.RELEASED, on_behalf_of: str = "") -> dict:
        """owners.check: each one held here is the caller's (or the operator's). The operator may free them for
        a credential: only what that one registered."""
        owner = on_behalf_of if conn.identity == auth.OPERATOR and on_behalf_of else conn.identity
        code = ErrorCode.REPLACED if code == ErrorCode.REPLACED else ErrorCode.RELEASED
        return {"released": self.service.releases.release_owned(partitions, owner, str(reason or "released by the "
                                                                                   "coordinator"), code)}

    def attach_app(self, app: str, pid: int) -> dict:
        self.service.apps[str(app)] = int(pid)
        self.service.last_app_seen = time.monotonic()
        return {"ok": True}

    def report_file_reads(self, bytes: int, partitions: dict[str, int] | None = None, owner: str = "") -> dict:
        """``partitions``: {partition id: bytes} a reader here read from our files. The reader's word, not an
        observation: counted apart from what we served (metrics name it "reported"), only for partitions held
        here that the reporting credential may read, and each report at most the partition's own size (one
        whole read of its file); the total the client adds up is not used."""
        for pid, nbytes in (partitions or {}).items():
            part = self.service.partitions.get(pid)
            if part is None or not isinstance(nbytes, int) or nbytes <= 0:
                continue
            if part.readers is not None and not auth.may_read(part.readers, part.owner, owner):
                continue
            counted = min(nbytes, part.bytes_in)
            part.file_bytes_read += counted
            self.service.traffic["local_file"] += counted
        return {"ok": True}

    def set_partition_readers(self, partition: str, readers: list[str]) -> dict:
        """Its writer names who may read a partition here besides the credential that registered it (the readers
        of its exchange): this service checks every request for it against them, whichever coordinator it serves."""
        part = self.service.partitions.get(partition)
        if part is None:
            raise ServiceError(f"partition {partition!r} is not held by service {self.service.service_id}",
                               ErrorCode.UNKNOWN_PARTITION)
        part.readers = checked_readers(readers)
        return {"ok": True}

    def report_backpressure(self, partition: str, seconds: float) -> dict:
        part = self.service.partitions.get(partition)
        if part is not None:
            part.backpressure_seconds = float(seconds)
        return {"ok": True}


class ExchangeCalls:
    """The coordinator's answers that need the connection, or both exchanges and streams."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.coordinator = service.coordinator
        self.streams = service.streams

    def subscribe(self, conn: ServerConnection, name: str, topic: str, seal: int | None = None) -> dict:
        from ..network.protocol import Notify

        previous = conn.subscriptions.pop(topic, None)
        if previous:
            previous()
        elif len(conn.subscriptions) >= MAX_SUBSCRIPTIONS:
            raise ServiceError(f"subscribing to exchange {name!r} is refused: this connection (credential "
                               f"{conn.identity!r}) holds {len(conn.subscriptions)} subscriptions, the most one "
                               "connection may (MAX_SUBSCRIPTIONS); unsubscribe from exchanges it no longer reads",
                               ErrorCode.LIMIT)
        elif conn.identity and conn.identity != auth.OPERATOR:
            held = sum(len(c.subscriptions) for c in self.service.connections if c.identity == conn.identity)
            if held >= MAX_SUBSCRIPTIONS:
                raise ServiceError(f"subscribing to exchange {name!r} is refused: credential {conn.identity!r} holds "
                                   f"{held} subscriptions over its connections, the most one credential may "
                                   f"({MAX_SUBSCRIPTIONS}); close readers it no longer needs", ErrorCode.LIMIT)
        conn.subscriptions[topic] = self.coordinator.subscribe(name, lambda body: conn.notify(Notify(topic, body)),
                                                               seal=seal)
        return {"ok": True}

    def unsubscribe(self, conn: ServerConnection, topic: str) -> dict:
        unsubscribe = conn.subscriptions.pop(topic, None)
        if unsubscribe:
            unsubscribe()
        return {"ok": True}

    def list_exchanges(self) -> list[dict]:
        return self.coordinator.list() + self.streams.list()

    async def get_exchange(self, name: str, wait: float = 0.0, need_subpartitions: bool = False,
                           allow_stream: bool = False, until_sealed: bool = False) -> dict:
        """``allow_stream``: a stream's description for a stream (readStream plans with its schema)."""
        try:
            return await self.coordinator.get_exchange(name, wait, need_subpartitions, until_sealed)
        except ServiceError as exc:
            if not allow_stream or exc.code != ErrorCode.NOT_A_BATCH:
                raise
            return await self.streams.describe(name)

    async def drop(self, name: str) -> dict:
        if self.streams.is_stream(name):
            return await self.streams.drop(name)
        return await self.coordinator.drop(name)


class Dispatcher:
    """Calls the handler the RPC table names for a method, with the arguments the table checked."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.holdings = ServiceHoldings(service)
        self.roles: dict[str, object] = {"service": ServiceCalls(service)}
        if service.coordinator is not None:
            self.roles.update(exchanges=ExchangeCalls(service), coordinator=service.coordinator,
                              streams=service.streams, groups=service.streams.groups)
        self._handlers: dict[str, tuple[Callable[..., Any], frozenset[str]]] = {}

    def handler(self, method: str) -> tuple[Callable[..., Any], frozenset[str]]:
        """The handler of ``method`` and which of the service's own arguments it takes."""
        found = self._handlers.get(method)
        if found is None:
            row = RPCS[method]
            role = self.roles.get(row.role)
            if role is None:
                raise ServiceError(f"service {self.service.service_id} does not have the coordinator role (method "
                                   f"{method!r})", ErrorCode.NOT_COORDINATOR)
            fn = getattr(role, row.method)
            found = self._handlers[method] = (fn, SERVICE_GIVEN & set(inspect.signature(fn).parameters))
        return found

    async def call(self, conn: ServerConnection, method: str, args: dict) -> Any:
        owners.check(conn.identity, method, args, self.holdings)
        fn, given = self.handler(method)
        if "owner" in given:
            args["owner"] = conn.identity  # never the client's say
        if "conn" in given:
            args["conn"] = conn
        result = fn(**args)
        return await result if inspect.isawaitable(result) else result
