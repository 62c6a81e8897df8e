"""The RPC table checks every argument before the service acts on it; error codes map to public classes."""
from __future__ import annotations

import errno
import inspect
import pickle

import pytest

import sparkflow_exchange
from sparkflow_exchange import errors
from sparkflow_exchange.errors import ErrorCode, InvalidRequest, code_of, error_for
from sparkflow_exchange.network.rpc import PID_MAX, RPCS, Who, check_args
from sparkflow_exchange.service.coordinator import Coordinator
from sparkflow_exchange.service.rpc_handlers import ExchangeCalls, ServiceCalls
from sparkflow_exchange.service.streams import StreamRegistry

DECLARE = {"name": "x", "schema": "s", "num_subpartitions": 4, "partitioner": {"name": "hash"},
           "partition_type": "HYBRID", "mode": "overwrite"}


@pytest.mark.parametrize("method, args, message", [
    ("attach_app", {"app": "jvm-1", "pid": 2**70}, "argument 'pid' = 1180591620717411303424 is outside 1..4194304"),
    ("attach_app", {"app": "jvm-1", "pid": 0}, "'pid' = 0 is outside"),
    ("attach_app", {"app": "jvm-1", "pid": "12"}, "argument 'pid' is str, not int"),
    ("attach_app", {"app": "jvm-1", "pid": True}, "argument 'pid' is bool, not int"),
    ("attach_app", {"app": "jvm-1"}, "argument 'pid' is missing"),
    ("attach_app", {"app": None, "pid": 5}, "argument 'app' must not be null"),
    ("report_file_reads", {"bytes": -1}, "argument 'bytes' = -1 is outside 0.."),
    ("report_backpressure", {"partition": "p", "seconds": float("nan")}, "'seconds' is nan, not a finite number"),
    ("get_exchange", {"name": "x", "wait": float("inf")}, "'wait' is inf, not a finite number"),
    ("get_exchange", {"name": "x", "wait": -1}, "'wait' = -1 is outside 0.."),
    ("get_exchange", {"name": "x", "colour": "red"}, "unknown argument(s) 'colour'"),
    ("declare", {**DECLARE, "partition_type": "SOMETIMES"}, "'partition_type' is 'SOMETIMES'; use one of HYBRID"),
    ("declare", {**DECLARE, "num_subpartitions": 1 << 20}, "'num_subpartitions' = 1048576 is outside 1..65536"),
    ("commit", {"name": "x", "epoch": 1, "write_id": "w", "partitions": ["a", 7]}, "'partitions' holds a int"),
    ("commit", {"name": "x", "epoch": 1, "write_id": "w", "partitions": [], "rows": {"a": 2**64}},
     "'rows' = 18446744073709551616 is outside"),
    ("producer_finished", {"name": "x", "epoch": 2**63, "partition": "p"}, "'epoch' = 9223372036854775808 is outside"),
    ("release_partitions", {"partitions": "p1"}, "'partitions' is str, not list"),
    ("no_such_method", {}, "unknown method 'no_such_method'"),
])
def test_bad_arguments_are_refused_naming_method_and_argument(method, args, message):
    with pytest.raises(InvalidRequest) as info:
        check_args(method, args)
    assert message in str(info.value)
    assert info.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.parametrize("method, args", [
    ("attach_app", {"app": "jvm-7", "pid": PID_MAX}),
    ("get_exchange", {"name": "x", "wait": 5}),  # an int where seconds are asked for
    ("declare", {**DECLARE, "num_subpartitions": None, "coalesce": True}),
    ("producer_failed", {"name": "x", "epoch": None, "partition": "p", "reason": "r"}),
    ("stream_join", {"name": "s", "group": None}),
    ("ping", {}),
])
def test_good_arguments_pass(method, args):
    check_args(method, args)


SERVICE_SUPPLIED = {"owner", "conn"}  # the connection's credential and the connection: never the client's say


def _roles() -> dict[str, object]:
    """What each role of the table is in a service with the coordinator (classes where a service is needed)."""
    coordinator = Coordinator(lambda targets, reason="", code="": None)
    streams = StreamRegistry(coordinator)
    return {"service": ServiceCalls, "exchanges": ExchangeCalls, "coordinator": coordinator, "streams": streams,
            "groups": streams.groups}


def _params(fn) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(fn).parameters.items() if n != "self" and n not in SERVICE_SUPPLIED}


@pytest.mark.parametrize("method", sorted(RPCS))
def test_each_row_names_its_handler_and_exactly_its_arguments(method):
    """One row is the whole RPC: its handler takes exactly the arguments the row lists (besides what the service
    gives), and every argument the handler requires the row requires."""
    row = RPCS[method]
    handler = getattr(_roles()[row.role], row.method)
    params = _params(handler)
    assert set(row) == set(params), (method, set(row) ^ set(params))
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    assert required <= {n for n, a in row.items() if a.required}
    if row.who is not Who.ANY:
        assert row.doing, f"{method}: a refusal says what it does"


@pytest.mark.parametrize("code, cls", [
    (ErrorCode.CONNECTION_LOST, sparkflow_exchange.ServiceUnavailable),
    (ErrorCode.UNREACHABLE, sparkflow_exchange.ServiceUnavailable),
    (ErrorCode.TIMEOUT, sparkflow_exchange.ServiceUnavailable),
    (ErrorCode.STORAGE, sparkflow_exchange.StorageError),
    (ErrorCode.AUTH, sparkflow_exchange.AuthenticationFailed),
    (ErrorCode.TLS, sparkflow_exchange.AuthenticationFailed),
    (ErrorCode.BAD_REQUEST, sparkflow_exchange.InvalidRequest),
    (ErrorCode.NO_EXCHANGE, sparkflow_exchange.ExchangeNotFound),
    (ErrorCode.EXCHANGE_LOST, sparkflow_exchange.ExchangeLost),
    (ErrorCode.REPLACED, sparkflow_exchange.ExchangeReplaced),
    (ErrorCode.SCHEMA_MISMATCH, sparkflow_exchange.SchemaMismatch),
    (ErrorCode.ROWS_LOST, sparkflow_exchange.DataLost),
    (ErrorCode.INTERNAL, sparkflow_exchange.ServiceError),
    ("a-code-from-a-newer-service", sparkflow_exchange.ServiceError),
])
def test_codes_map_to_public_classes(code, cls):
    exc = error_for(code, "the cause")
    assert type(exc) is cls and str(exc) == "the cause"
    assert isinstance(exc, sparkflow_exchange.ExchangeError) and isinstance(exc, errors.UserFacing)
    assert type(exc).__module__ == "sparkflow_exchange" and hasattr(sparkflow_exchange, type(exc).__name__)


def test_every_public_error_is_exported_and_documented():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "errors.md").read_text()
    for cls in errors.PUBLIC:
        assert getattr(sparkflow_exchange, cls.__name__) is cls
        assert cls.__name__ in sparkflow_exchange.__all__ or cls is errors.UserFacing
        assert cls.__doc__ and (cls is errors.UserFacing or f"`{cls.__name__}`" in doc), cls


def test_storage_failures_get_the_storage_code():
    assert code_of(OSError(errno.ENOSPC, "No space left on device"), ErrorCode.FAILED) is ErrorCode.STORAGE
    assert code_of(OSError(errno.ENAMETOOLONG, "File name too long"), ErrorCode.FAILED) is ErrorCode.STORAGE
    assert code_of(OSError(errno.EMFILE, "Too many open files"), ErrorCode.FAILED) is ErrorCode.STORAGE
    assert code_of(OSError(errno.ECONNRESET, "reset"), ErrorCode.FAILED) is ErrorCode.FAILED
    assert code_of(sparkflow_exchange.ExchangeNotFound("x"), ErrorCode.FAILED) is ErrorCode.NO_EXCHANGE


def test_errors_survive_pickling():
    """Spark ships a task's exception to the driver pickled."""
    exc = pickle.loads(pickle.dumps(error_for(ErrorCode.STORAGE, "disk full")))
    assert type(exc) is sparkflow_exchange.StorageError and str(exc) == "disk full"
    assert exc.code is ErrorCode.STORAGE


def test_attach_app_with_an_absurd_pid_is_refused_and_the_service_goes_on(tmp_service):
    svc = tmp_service()
    with svc.connect() as conn:
        with pytest.raises(InvalidRequest, match=r"bad 'attach_app' request: argument 'pid' = \d+ is outside"):
            conn.call("attach_app", app="jvm-x", pid=2**70)
        with pytest.raises(InvalidRequest, match="unknown method 'launch_missiles'"):
            conn.call("launch_missiles")
        assert conn.call("ping")["service_id"]
        assert conn.call("status")["apps"] == {}
