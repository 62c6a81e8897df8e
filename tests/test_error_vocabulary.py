"""One vocabulary of errors in both languages: the Java classes and codes of the plugin jar agree with
``sparkflow_exchange/errors.py``, docs/errors.md's code table is the code's table, and a PySpark error that carries
a failure of the jar (its marker) or of the Python data source comes back as the package's class."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import run_app_with_jar
from harness import client_config, start_service

import sparkflow_exchange as sfx
from sparkflow_exchange import contract, errors
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh

ROOT = Path(__file__).resolve().parent.parent
JAVA = ROOT / "jvm-stub" / "src" / "main" / "java" / "org" / "sparkflow" / "exchange"
ERRORS_JAVA = JAVA / "errors"
SCHEMA = pa.schema([pa.field("a", pa.int64())])
SERVICE_CLASSES = [c for c in errors.PUBLIC if issubclass(c, errors.ServiceError)]


def java_codes() -> dict[str, str]:
    """The codes ``ErrorCodes`` names: those it inherits from the generated ``contract.Contract.ErrorCode`` (made from
    contract.json, as tests/test_contract.py checks), and none of its own."""
    text = (ERRORS_JAVA / "ErrorCodes.java").read_text()
    assert "public final class ErrorCodes extends Contract.ErrorCode {" in text
    assert not re.findall(r'static final String (\w+) =', text), "ErrorCodes spells a code of its own"
    return dict(contract.load()["error_codes"])


def test_codes_meet_classes_in_the_contract_only():
    """Both languages take the table from a code to its class from contract.json's ``error_classes`` (the jar's
    generated ``Contract.ErrorClass.OF``, whose values tests/test_contract.py checks): neither spells it."""
    assert {code.name: cls.__name__ for code, cls in errors._CLASS_OF.items()} == contract.load()["error_classes"]
    text = (ERRORS_JAVA / "ErrorCodes.java").read_text()
    assert "CLASS_OF = Contract.ErrorClass.OF;" in text and not re.findall(r"Map\.entry\(", text)
    assert set(contract.load()["error_classes"].values()) <= {c.__name__ for c in SERVICE_CLASSES}


def test_java_codes_are_the_python_codes():
    assert java_codes() == {code.name: code.value for code in errors.ErrorCode}


def test_the_java_factory_makes_each_class_the_table_names():
    factory = (ERRORS_JAVA / "ErrorCodes.java").read_text()
    for cls in set(contract.load()["error_classes"].values()):
        assert f'case "{cls}" -> new {cls}(message, c, cause);' in factory, cls


@pytest.mark.parametrize("cls", [*SERVICE_CLASSES, errors.ExchangeReadError], ids=lambda c: c.__name__)
def test_every_public_error_has_a_java_class_of_its_name_parent_and_default_code(cls):
    source = ERRORS_JAVA / f"{cls.__name__}.java"
    assert source.is_file(), f"no Java class {cls.__name__}"
    text = source.read_text()
    python_parent = next(b for b in cls.__mro__[1:] if b in (errors.ServiceError, errors.ExchangeError))
    assert f"public class {cls.__name__} extends {python_parent.__name__} " in text
    default = re.search(r"return ErrorCodes\.(\w+);", text)
    inherited = errors.ExchangeError.default_code if python_parent is errors.ExchangeError else errors.ErrorCode.ERROR
    assert (errors.ErrorCode[default.group(1)] if default else inherited) == cls.default_code


def test_java_code_throws_named_errors_with_known_codes():
    """A failure leaves the jar as a class of errors/ (``ErrorCodes.error(code, ...)`` or ``new <Class>``), never as a
    bare WireException, and every code it names is one Python knows."""
    codes = java_codes()
    for source in JAVA.rglob("*.java"):
        text = source.read_text()
        if source.name != "WireException.java":
            assert "new WireException(" not in text, f"{source}: throw ErrorCodes.error(ErrorCodes.X, message)"
        for name in re.findall(r"ErrorCodes\.([A-Z_]+)\b", text):
            assert name in codes, f"{source}: ErrorCodes.{name} is not a code"
        for literal in re.findall(r'ErrorCodes\.error\("(\w+)"', text):
            pytest.fail(f"{source}: code {literal!r} as a string: use its ErrorCodes constant")


def docs_code_table() -> dict[str, str]:
    text = (ROOT / "docs" / "errors.md").read_text()
    section = text.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    table: dict[str, str] = {}
    for codes, cls in re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| `(\w+)` \|$", section, re.M):
        for code in re.findall(r"`(\w+)`", codes):
            assert code not in table, f"docs/errors.md lists code {code!r} twice"
            table[code] = cls
    return table


def test_docs_code_table_is_the_codes_table():
    assert docs_code_table() == {code.value: cls.__name__ for code, cls in errors._CLASS_OF.items()}


def test_docs_class_table_names_every_public_class():
    text = (ROOT / "docs" / "errors.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", text.split("## The classes", 1)[1].split("\n## ", 1)[0], re.M))
    assert rows == {c.__name__ for c in (*errors.PUBLIC, errors.NoConsumerError)} - {"UserFacing"}


JOB_FAILURE = (
    "An error occurred while calling o61.collectToPython.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed 1 times, most "
    "recent failure: Lost task 0.0 in stage 1.0 (TID 1) (10.0.0.2 executor driver): "
    "org.sparkflow.exchange.errors.ExchangeLost: [sparkflow_exchange.ExchangeLost exchange_lost] exchange 'held' was "
    "lost: the exchange service that held it (pid 42) ended without shutting down\n"
    "\tat org.sparkflow.exchange.wire.RpcConnection.call(RpcConnection.java:94)\n"
    "Caused by: org.sparkflow.exchange.errors.ServiceUnavailable: [sparkflow_exchange.ServiceUnavailable lost] "
    "connection closed\n")


def test_from_spark_gives_the_outermost_marked_failure_with_its_message_and_code():
    spark_error = RuntimeError(JOB_FAILURE)
    error = errors.from_spark(spark_error)
    assert type(error) is sfx.ExchangeLost
    assert str(error) == "exchange 'held' was lost: the exchange service that held it (pid 42) ended without " \
                         "shutting down"
    assert error.code == sfx.ErrorCode.EXCHANGE_LOST
    assert error.__cause__ is spark_error


def test_from_spark_reads_a_python_data_source_failure_and_keeps_a_code_it_does_not_know_as_error():
    worker = RuntimeError("[PYTHON_DATA_SOURCE_ERROR] Failed to read: Traceback...\n"
                          "sparkflow_exchange.ExchangeNotFound: exchange 'x' does not exist (waited 5 s)\n")
    error = errors.from_spark(worker)
    assert type(error) is sfx.ExchangeNotFound and error.code == sfx.ErrorCode.NO_EXCHANGE
    assert str(error) == "exchange 'x' does not exist (waited 5 s)"
    newer = errors.from_spark(RuntimeError("[sparkflow_exchange.ServiceError some_new_code] what happened"))
    assert type(newer) is sfx.ServiceError and newer.code == sfx.ErrorCode.ERROR


def test_from_spark_gives_none_for_other_errors_and_for_names_that_are_not_errors():
    assert errors.from_spark(RuntimeError("org.apache.spark.SparkException: Job aborted: java.io.IOException")) is None
    assert errors.from_spark(RuntimeError("[sparkflow_exchange.ExchangeConfig error] not an error class")) is None
    assert errors.from_spark(RuntimeError("sparkflow_exchange.UserFacing: a marker, not an error")) is None


def test_translate_errors_raises_the_package_class_and_passes_others_unchanged():
    with pytest.raises(sfx.ExchangeLost, match="^exchange 'held' was lost") as caught:
        with sfx.translate_errors():
            raise RuntimeError(JOB_FAILURE)
    assert isinstance(caught.value.__cause__, RuntimeError)
    other = KeyError("k")
    with pytest.raises(KeyError) as passed:
        with sfx.translate_errors():
            raise other
    assert passed.value is other


FAST = {"heartbeatInterval": "0.2s", "heartbeatTimeout": "1s"}


def _until(what: str, check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _state(coordinator, service_id: str) -> str | None:
    return {s["service_id"]: s["state"] for s in coordinator.status()["services"]}.get(service_id)


@pytest.mark.spark
def test_a_lost_service_read_through_the_jar_raises_exchange_lost_in_pyspark(tmp_path, jar):
    coordinator = start_service(tmp_path / "coordinator", conf=FAST)
    try:
        worker = start_service(tmp_path / "worker", coordinator=False, host_id="worker",
                               conf={**FAST, "coordinator": coordinator.tcp})
        service_id = worker.info["service_id"]
        _until("the worker registered", lambda: _state(coordinator, service_id) == "alive")
        cfg = client_config(coordinator, service=worker.tcp, exchange="held", keys="a", numSubpartitions=2)
        handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
        task = ex.ProducerTask(handle, 0, "a0")
        task.write([pa.record_batch([pa.array(range(100))], schema=SCHEMA)])
        wh.commit_write(handle, [task.finish()["partition"]])
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(30)
        _until("the worker declared lost", lambda: _state(coordinator, service_id) == "lost")

        defaults = (f"spark.sparkflow.exchange.coordinator {coordinator.tcp}\n"
                    f"spark.sparkflow.exchange.secretFile {coordinator.home / 'secret'}\n")
        (tmp_path / "app").mkdir()
        result, _ = run_app_with_jar(tmp_path / "app", (Path(__file__).parent / "app_jvm_errors.py").read_text(),
                                     jar, defaults=defaults, timeout=600)
    finally:
        coordinator.stop()
    lost = result["catalog_of_lost"]
    assert lost["raised"] == "sparkflow_exchange.ExchangeLost", lost
    assert lost["code"] == "exchange_lost"
    assert lost["message"].startswith("exchange 'held' was lost: "), lost["message"]
    assert "worker" in lost["message"]  # the host it went with
    # what the JVM threw: the Java class of the same name, its message carrying the marker
    assert "org.sparkflow.exchange.errors.ExchangeLost: [sparkflow_exchange.ExchangeLost exchange_lost] " \
           + lost["message"] in lost["spark"], lost["spark"][:3000]
    missing = result["format_of_missing"]
    assert missing["raised"] == "sparkflow_exchange.ExchangeNotFound", missing
    assert missing["message"].startswith("exchange 'never_declared' does not exist (waited 1 s"), missing
    assert "org.sparkflow.exchange.errors.ExchangeNotFound" in missing["spark"]
