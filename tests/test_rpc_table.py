"""The RPC table checks every argument before the service acts on it; error codes map to public classes."""
from __future__ import annotations

import errno
import inspect
import pickle

import pytest

import sparkflow_exchange
from sparkflow_exchange import errors
from sparkflow_exchange.errors import ErrorCode, InvalidRequest, code_of, error_for
from sparkflow_exchange.network.rpc import PID_MAX, RPCS, check_args
from sparkflow_exchange.service.coordinator import Coordinator
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


SERVICE_SUPPLIED = {"owner"}  # the connection's credential, set by the service: never the client's say


def _params(fn) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items() if n != "self"} - SERVICE_SUPPLIED


@pytest.mark.parametrize("method, handler", [
    ("declare", Coordinator.declare), ("register_producer", Coordinator.register_producer),
    ("producer_finished", Coordinator.producer_finished), ("producer_failed", Coordinator.producer_failed),
    ("commit", Coordinator.commit), ("abort", Coordinator.abort), ("drop", Coordinator.drop),
    ("stream_declare", StreamRegistry.declare), ("stream_begin_epoch", StreamRegistry.begin_epoch),
    ("stream_commit_epoch", StreamRegistry.commit_epoch), ("stream_abort_epoch", StreamRegistry.abort_epoch),
    ("stream_describe", StreamRegistry.describe), ("stream_join", StreamRegistry.join),
    ("stream_latest", StreamRegistry.latest), ("stream_plan", StreamRegistry.plan),
    ("stream_commit_group", StreamRegistry.commit_group), ("stream_leave", StreamRegistry.leave),
])
def test_the_table_matches_the_handlers(method, handler):
    """The table names exactly the handler's arguments, and requires those the handler requires."""
    table = set(RPCS[method])
    params = _params(handler)
    assert table == params
    required = {n for n, p in inspect.signature(handler).parameters.items()
                if n != "self" and p.default is inspect.Parameter.empty}
    assert required <= {n for n, a in RPCS[method].items() if a.required}


def test_get_exchange_table_matches_the_coordinator():
    assert set(RPCS["get_exchange"]) - {"allow_stream"} == _params(Coordinator.get_exchange)


def test_the_table_names_every_argument_the_service_reads_itself():
    """The methods the service answers inline (not through a handler's signature): every ``args[...]`` and
    ``args.get(...)`` of their branch is in the table, so a new argument cannot be refused as unknown."""
    import ast
    from pathlib import Path

    from sparkflow_exchange.service import exchange_service

    tree = ast.parse(Path(exchange_service.__file__).read_text())
    rpc = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "rpc")
    seen = {}
    for branch in ast.walk(rpc):
        if not (isinstance(branch, ast.If) and isinstance(branch.test, (ast.Compare, ast.BoolOp))):
            continue
        test = branch.test.values[0] if isinstance(branch.test, ast.BoolOp) else branch.test
        if not (isinstance(test, ast.Compare) and getattr(test.left, "id", None) == "method"
                and isinstance(test.comparators[0], ast.Constant)):
            continue
        names = set()
        for node in ast.walk(branch):
            if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "args":
                names.add(node.slice.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and getattr(node.func.value, "id", None) == "args" and node.args:
                names.add(node.args[0].value)
        seen[test.comparators[0].value] = names
    assert {"attach_app", "report_file_reads", "release_partitions", "subscribe"} <= set(seen)
    for method, names in seen.items():
        assert names <= set(RPCS[method]), (method, names - set(RPCS[method]))


def test_subscribe_table_matches_the_coordinator():
    """A subscription names its topic (the connection's); the rest goes to the coordinator."""
    assert set(RPCS["subscribe"]) == _params(Coordinator.subscribe) - {"callback"} | {"topic"}


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
