"""The RPC table: every method a service answers, who may call it, and its arguments' types and ranges.

A request is checked here, before anything acts on it, so a wrong type or an absurd value (a pid of
2**70, a negative byte count, a wait of NaN) is refused with an error naming the method and the
argument, instead of failing later and elsewhere (in a housekeeping task, with an OverflowError).
Sans-IO; the server checks every :class:`RpcRequest` with :func:`check_args`, and the service asks
``service/owners.py`` whether the connection's credential may call it (each row's :class:`Who`).
"""
from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any

from ..config import MAX_REPLICAS
from ..errors import ErrorCode, InvalidRequest
from ..kinds import PartitionType

INT64 = (-(1 << 63), (1 << 63) - 1)
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no process id is larger
MAX_WAIT = 10 * 365 * 86400.0  # seconds: longer than any deadline a client means
# What a client may make the service keep and list to everyone, so listings and status stay far below the
# frame maximum: the name of an exchange, stream or consumer group it declares, in characters
# (docs/deployment.md, "Limits"); every other identifier (partition ids, attempts, queries, addresses,
# a stream epoch's exchange ``<stream>#<epoch>``); a reason; an object (a location, a partitioner) as JSON;
# a schema (base64 Arrow IPC: 4 MiB is some 50,000 columns).
MAX_NAME_LENGTH = 256
MAX_ID_LENGTH = 1024
MAX_REASON_LENGTH = 16 * 1024
MAX_OBJECT_LENGTH = 16 * 1024
MAX_SCHEMA_LENGTH = 4 << 20


@dataclass(frozen=True)
class Arg:
    """One argument: its JSON type, whether it may be left out or be null, its range, its items' type."""

    kind: type
    required: bool = True
    nullable: bool = False
    low: float | None = None
    high: float | None = None
    items: type | None = None  # a list's items, a dict's values (dict keys are strings in JSON)
    choices: tuple[str, ...] = ()
    longest: int | None = None  # a string's (a list's strings', an object's JSON) most characters
    what: str = ""  # what the string is, for a refusal of its length

    def check(self, method: str, name: str, value: Any) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidRequest(f"bad {method!r} request: argument {name!r} must not be null")
            return
        if not _is_a(value, self.kind):
            raise InvalidRequest(f"bad {method!r} request: argument {name!r} is {type(value).__name__}, "
                                 f"not {self.kind.__name__}")
        if self.kind in (int, float):
            self._check_range(method, name, value)
        elif self.items is not None:
            values = value.values() if isinstance(value, dict) else value
            for item in values:
                if not _is_a(item, self.items):
                    raise InvalidRequest(f"bad {method!r} request: argument {name!r} holds a "
                                         f"{type(item).__name__}, not {self.items.__name__}")
                if self.items is int:
                    self._check_range(method, name, item)
        if self.longest is not None:
            self._check_length(method, name, value)
        if self.choices and value not in self.choices:
            raise InvalidRequest(f"bad {method!r} request: argument {name!r} is {value!r}; use one of "
                                 f"{', '.join(self.choices)}")

    def _check_length(self, method: str, name: str, value: Any) -> None:
        if isinstance(value, dict):
            size = len(json.dumps(value))
            if size > self.longest:
                raise InvalidRequest(f"bad {method!r} request: argument {name!r} is {size} characters of JSON; "
                                     f"{self.what or 'an object'} may be at most {self.longest}")
            return
        for text in value if isinstance(value, list) else (value,):
            if isinstance(text, str) and len(text) > self.longest:
                raise InvalidRequest(f"bad {method!r} request: argument {name!r} is {len(text)} characters long; "
                                     f"{self.what or 'it'} may be at most {self.longest} characters")

    def _check_range(self, method: str, name: str, value: int | float) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"bad {method!r} request: argument {name!r} is {value}, not a finite number")
        low, high = (self.low, self.high) if self.low is not None or self.high is not None or self.kind is float \
            else INT64
        if (low is not None and value < low) or (high is not None and value > high):
            raise InvalidRequest(f"bad {method!r} request: argument {name!r} = {value} is outside "
                                 f"{_bound(low)}..{_bound(high)}")


def _bound(value: float | None) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _is_a(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool  # JSON true is not the number 1
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _opt(arg: Arg, nullable: bool = False) -> Arg:
    """``arg`` may be left out (and, with ``nullable``, be null)."""
    return Arg(arg.kind, False, nullable or arg.nullable, arg.low, arg.high, arg.items, arg.choices, arg.longest,
               arg.what)


def _null(arg: Arg) -> Arg:
    """``arg`` must be given, and may be null."""
    return Arg(arg.kind, True, True, arg.low, arg.high, arg.items, arg.choices, arg.longest, arg.what)


class Who(enum.StrEnum):
    """Who may call an RPC (besides the operator, who may call every one). A rule about a named object holds
    when the object exists; naming one that does not is left to the handler (a declare creates it)."""

    ANY = "any credential"  # reads, listings, and a connection's own subscriptions
    OPERATOR = "the operator"  # the whole service: stopping it, its registry of services, its lifetime
    OWNER = "the owner of the exchange or stream it names"  # ``name``: the credential that declared it
    GROUP = "the owner of the consumer group it names"  # ``group`` of stream ``name``, or the stream's owner
    PARTITIONS = "the owner of the partitions it names"  # ``partition(s)`` held here: who registered them
    READER = "a reader of the exchange or stream it names"  # ``name``: its owner, or a credential of its readers


class Rpc(dict):
    """One row of the table, all an RPC is: its arguments (a dict, name -> :class:`Arg`), who may call it,
    its handler (``"<role>.<method>"``: the object of the service that answers it, and the method; an
    argument the handler takes that the table does not list, ``owner`` or ``conn``, is the service's to
    give: the connection's credential, the connection), and what it does to what it names (for a refusal)."""

    def __init__(self, who: Who, handler: str, args: dict[str, Arg], doing: str = "") -> None:
        super().__init__(args)
        self.who = who
        self.role, _, self.method = handler.partition(".")
        self.doing = doing


TEXT = Arg(str, longest=MAX_ID_LENGTH, what="an identifier")
NAME = Arg(str, longest=MAX_NAME_LENGTH, what="the name of an exchange, stream or consumer group (MAX_NAME_LENGTH)")
REASON = Arg(str, longest=MAX_REASON_LENGTH, what="a reason")  # clipped, not refused: a failure is still told
GROUPS = Arg(list, items=str, longest=MAX_NAME_LENGTH, what=NAME.what)
SCHEMA = Arg(str, longest=MAX_SCHEMA_LENGTH, what="a schema")
INT = Arg(int, low=INT64[0], high=INT64[1])
COUNT = Arg(int, low=0, high=INT64[1])
WIDTH = Arg(int, low=1, high=1 << 16)  # numSubpartitions (a service keeps at most 65536 per partition)
WAIT = Arg(float, low=0.0, high=MAX_WAIT)
SECONDS = Arg(float, low=0.0, high=MAX_WAIT * 10)
FLAG = Arg(bool)
NAMES = Arg(list, items=str, longest=MAX_ID_LENGTH, what="an identifier")
COUNTS = Arg(list, items=int)
ROWS = Arg(dict, items=int)
OBJECT = Arg(dict, longest=MAX_OBJECT_LENGTH, what="an object (a location, a partitioner)")
TYPE = Arg(str, choices=tuple(t.value for t in PartitionType))

_DECLARE = {"name": NAME, "schema": SCHEMA, "num_subpartitions": _null(WIDTH), "partitioner": OBJECT,
            "partition_type": TYPE, "coalesce": _opt(FLAG)}

# roles: "service" (every service), "exchanges" (the coordinator's answers about exchanges and streams that
# need the connection), "coordinator", "streams" and "groups" (a stream's consumer groups)
RPCS: dict[str, Rpc] = {
    # every service
    "ping": Rpc(Who.ANY, "service.ping", {}),
    "status": Rpc(Who.ANY, "service.status", {}),
    "shutdown": Rpc(Who.OPERATOR, "service.shutdown", {}, "stopping the service"),
    "release_partitions": Rpc(Who.PARTITIONS, "service.release_partitions", {
        "partitions": NAMES, "reason": _opt(REASON, True),
        "code": _opt(Arg(str, choices=(ErrorCode.RELEASED, ErrorCode.REPLACED))),
        # the operator (a coordinator) frees them for this credential: only the partitions that credential
        # registered are freed
        "on_behalf_of": _opt(TEXT)}, "releasing"),
    "attach_app": Rpc(Who.OPERATOR, "service.attach_app", {"app": TEXT, "pid": Arg(int, low=1, high=PID_MAX)},
                      "attaching an application to the service's lifetime"),
    "report_file_reads": Rpc(Who.ANY, "service.report_file_reads",
                             {"bytes": COUNT, "partitions": _opt(Arg(dict, items=int), True)}),
    "set_partition_readers": Rpc(Who.PARTITIONS, "service.set_partition_readers",
                                 {"partition": TEXT, "readers": NAMES}, "naming the readers of"),
    "report_backpressure": Rpc(Who.PARTITIONS, "service.report_backpressure", {"partition": TEXT, "seconds": SECONDS},
                               "reporting the backpressure of"),
    # the coordinator: the services that hold partitions for it (service/service_roster.py)
    "register_service": Rpc(Who.OPERATOR, "coordinator.register_service", {
        "service_id": TEXT, "host_id": TEXT, "tcp": TEXT, "unix": TEXT, "pid": Arg(int, low=1, high=PID_MAX)},
        "registering an exchange service"),
    "service_heartbeat": Rpc(Who.OPERATOR, "coordinator.service_heartbeat", {"service_id": TEXT},
                             "an exchange service's heartbeat"),
    "list_services": Rpc(Who.ANY, "coordinator.list_services", {}),
    # the coordinator: batch exchanges
    "subscribe": Rpc(Who.READER, "exchanges.subscribe", {"name": TEXT, "topic": TEXT, "seal": _opt(COUNT, True)},
                     "reading"),
    "unsubscribe": Rpc(Who.ANY, "exchanges.unsubscribe", {"topic": TEXT}),
    "list_exchanges": Rpc(Who.ANY, "exchanges.list_exchanges", {}),
    "declare": Rpc(Who.OWNER, "coordinator.declare", {**_DECLARE, "mode": TEXT,
                                                      "replicas": _opt(Arg(int, low=0, high=MAX_REPLICAS)),
                                                      "readers": _opt(NAMES)}, "writing"),
    "register_producer": Rpc(Who.OWNER, "coordinator.register_producer", {
        "name": TEXT, "epoch": INT, "write_id": TEXT, "index": COUNT, "attempt": TEXT, "partition": TEXT,
        "location": OBJECT, "num_subpartitions": _opt(INT, True)}, "writing"),
    "producer_finished": Rpc(Who.OWNER, "coordinator.producer_finished", {
        "name": TEXT, "epoch": INT, "partition": TEXT, "spill": _opt(TEXT), "subpartition_bytes": _opt(COUNTS, True),
        "subpartition_rows": _opt(COUNTS, True), "rows": _opt(COUNT, True), "bytes": _opt(COUNT, True),
        "raw_bytes": _opt(COUNT, True), "subpartition_raw_bytes": _opt(COUNTS, True),
        "replicas": _opt(NAMES, True)}, "writing"),
    "producer_failed": Rpc(Who.OWNER, "coordinator.producer_failed",
                           {"name": TEXT, "epoch": _null(INT), "partition": TEXT, "reason": REASON}, "writing"),
    "commit": Rpc(Who.OWNER, "coordinator.commit", {"name": TEXT, "epoch": INT, "write_id": TEXT, "partitions": NAMES,
                                                    "rows": _opt(ROWS, True)}, "committing a write of"),
    "abort": Rpc(Who.OWNER, "coordinator.abort", {"name": TEXT, "epoch": INT, "write_id": TEXT,
                                                  "reason": _opt(REASON)}, "aborting a write of"),
    "drop": Rpc(Who.OWNER, "exchanges.drop", {"name": TEXT}, "dropping"),
    "get_exchange": Rpc(Who.READER, "exchanges.get_exchange", {"name": TEXT, "wait": _opt(WAIT),
                                                               "need_subpartitions": _opt(FLAG),
                                                               "allow_stream": _opt(FLAG), "until_sealed": _opt(FLAG)},
                        "reading"),
    # the coordinator: streams
    "stream_declare": Rpc(Who.OWNER, "streams.declare", {**_DECLARE, "max_retained_bytes": _opt(COUNT),
                                                         "groups": _opt(GROUPS, True), "readers": _opt(NAMES)}, "writing"),
    "stream_begin_epoch": Rpc(Who.OWNER, "streams.begin_epoch", {"name": TEXT, "epoch": INT, "query": TEXT,
                                                                 "run": TEXT, "wait": _opt(WAIT)}, "writing"),
    "stream_commit_epoch": Rpc(Who.OWNER, "streams.commit_epoch", {"name": TEXT, "epoch": INT, "partitions": NAMES,
                                                                   "rows": _opt(ROWS, True)},
                               "committing an epoch of"),
    "stream_abort_epoch": Rpc(Who.OWNER, "streams.abort_epoch", {"name": TEXT, "epoch": INT, "reason": _opt(REASON)},
                              "aborting an epoch of"),
    "stream_describe": Rpc(Who.READER, "streams.describe", {"name": TEXT, "wait": _opt(WAIT)}, "reading"),
    "stream_join": Rpc(Who.GROUP, "groups.join", {"name": TEXT, "group": _opt(NAME, True), "start": _opt(TEXT)},
                       "joining"),
    "stream_latest": Rpc(Who.GROUP, "groups.latest", {
        "name": TEXT, "group": TEXT, "after": INT, "max_epochs": _opt(COUNT, True), "max_rows": _opt(COUNT, True),
        "max_bytes": _opt(COUNT, True), "upto": _opt(INT, True), "wait": _opt(WAIT)},
        "reading with (it moves its position)"),
    "stream_plan": Rpc(Who.READER, "groups.plan", {"name": TEXT, "after": INT, "upto": INT}, "reading"),
    "stream_commit_group": Rpc(Who.GROUP, "groups.commit_group", {"name": TEXT, "group": TEXT, "epoch": INT},
                               "committing"),
    "stream_leave": Rpc(Who.GROUP, "groups.leave", {"name": TEXT, "group": TEXT}, "leaving"),
}


def check_args(method: str, args: Any) -> None:
    """Refuse a request whose method is unknown or whose arguments do not match the table."""
    spec = RPCS.get(method) if isinstance(method, str) else None
    if spec is None:
        raise InvalidRequest(f"unknown method {method!r}")
    if not isinstance(args, dict):
        raise InvalidRequest(f"bad {method!r} request: arguments are {type(args).__name__}, not an object")
    unknown = sorted(set(args) - set(spec))
    if unknown:
        raise InvalidRequest(f"bad {method!r} request: unknown argument(s) {', '.join(map(repr, unknown))}")
    for name, arg in spec.items():
        if name not in args:
            if arg.required:
                raise InvalidRequest(f"bad {method!r} request: argument {name!r} is missing")
            continue
        value = args[name]
        if arg.what == REASON.what and isinstance(value, str) and len(value) > MAX_REASON_LENGTH:
            args[name] = value[:MAX_REASON_LENGTH - 6] + " [...]"
        arg.check(method, name, args[name])
