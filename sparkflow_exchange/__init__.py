"""sparkflow-exchange: Flink's data exchange as a PySpark data source and sink, ``format("pipelined")``."""
from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, Iterator

__version__ = "0.4.0.dev0"
__all__ = ["SPARK_SETTINGS", "register", "drop_exchange", "list_exchanges", "leave_group", "write", "plugin_jar", "configure", "ExchangeConfig",
           "PartitionType", "Partitioner", "ExchangeState", "ExchangeKind", "ExchangeSummary", "ExchangeDescription", "StreamSummary", "open_reader", "open_writer", "ExchangeWriter",
           # the errors users see (docs/errors.md)
           "ConfigError", "ExchangeError", "ServiceError", "ServiceUnavailable", "AuthenticationFailed", "NotPermitted",
           "LimitReached", "InvalidRequest", "StorageError", "DataLost", "ExchangeNotFound", "ExchangeLost", "ExchangeReplaced",
           "PartitionReleasedError", "SchemaMismatch", "NoConsumerError", "ExchangeReadError", "ErrorCode", "translate_errors"]

from .config import PREFIX, ExchangeConfig, session_settings
from .description import ExchangeDescription
from .errors import (  # noqa: F401
    AuthenticationFailed,
    ConfigError,
    DataLost,
    ErrorCode,
    ExchangeError,
    ExchangeLost,
    ExchangeNotFound,
    ExchangeReadError,
    ExchangeReplaced,
    InvalidRequest,
    LimitReached,
    NoConsumerError,
    NotPermitted,
    PartitionReleasedError,
    SchemaMismatch,
    ServiceError,
    ServiceUnavailable,
    StorageError,
    UserFacing,
    translate_errors,
)
from .kinds import ExchangeKind, ExchangeState, Partitioner, PartitionType
from .spark.session_setup import configure, plugin_jar
from .spark.session_tuning import SPARK_SETTINGS  # for the session builder: .config(map=SPARK_SETTINGS)
from .summary import ExchangeSummary, StreamSummary

if TYPE_CHECKING:  # imported on first use (pyarrow, the data path): importing the package stays light
    from .client import ExchangeWriter, open_reader, open_writer  # noqa: F401

_registered: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()  # session -> settings


def __getattr__(name: str) -> Any:
    if name in ("open_reader", "open_writer", "ExchangeWriter"):  # reading and writing without Spark (client.py)
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'sparkflow_exchange' has no attribute {name!r}")


def register(spark: Any) -> None:
    """Register ``format("pipelined")`` on ``spark``, carrying the session's ``spark.sparkflow.exchange.*`` settings.

    Installing the package registers the format already, but Spark's planning workers (``schema``,
    ``reader``, ``writer``) see only options, spark-defaults.conf and what a registered class carries.
    The settings are captured now: call it again after ``spark.conf.set`` of a key planning reads
    (every key outside ``config.TASK_KEYS``). Works on classic and Spark Connect sessions. A classic
    session's task slots (its ``defaultParallelism``) go with them as ``taskSlots`` unless the session sets
    that: a read planned while its exchange is written is laid out to them.
    """
    from .spark.datasource import PipelinedDataSource

    settings = _planning_settings(spark)
    ExchangeConfig.load(spark_conf={}, session=settings)  # a bad session setting fails here, in the user's process
    if not settings and spark not in _registered and _statically_registered(spark):
        _registered[spark] = settings  # the installed package's registration carries as much: nothing to replace
        return
    source = type("PipelinedDataSource", (PipelinedDataSource,), {
        "session_conf": settings, "__module__": PipelinedDataSource.__module__,
        # not an importable name, so cloudpickle ships the class with its settings by value
        "__qualname__": "PipelinedDataSource_with_session", "__doc__": PipelinedDataSource.__doc__})
    with _quiet_replacement(spark):
        spark.dataSource.register(source)
    _registered[spark] = settings


_DATA_SOURCE_LOG = "org.apache.spark.sql.execution.datasources.DataSourceManager"


def _statically_registered(spark: Any) -> bool:
    """Whether ``format("pipelined")`` is already known to the session (the installed package's own
    registration); False when it cannot be told (Spark Connect: the server registers it the same way)."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("pipelined"))
    except Exception:  # noqa: BLE001 - Spark Connect, or another Spark's internals
        return False


@contextlib.contextmanager
def _quiet_replacement(spark: Any) -> Iterator[None]:
    """Spark warns that registering replaces the package's static registration, which is the point of
    ``register``: its logger is held at ERROR for the call (classic sessions; Connect logs on the server)."""
    try:
        jvm = spark.sparkContext._jvm
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        before = jvm.org.apache.logging.log4j.LogManager.getLogger(_DATA_SOURCE_LOG).getLevel()
        configurator.setLevel(_DATA_SOURCE_LOG, jvm.org.apache.logging.log4j.Level.ERROR)
    except Exception:  # noqa: BLE001 - no JVM here (Spark Connect)
        yield
        return
    try:
        yield
    finally:
        configurator.setLevel(_DATA_SOURCE_LOG, before)


TASK_SLOTS = PREFIX + "taskSlots"


def _planning_settings(spark: Any) -> dict[str, str]:
    """The session's settings as planning needs them: its ``spark.sparkflow.exchange.*`` settings and, for a
    classic session that does not set ``taskSlots``, its default parallelism as the task slots (planning workers
    cannot ask the session for it; a Spark Connect client cannot either, and leaves it to the server's)."""
    settings = session_settings(spark.conf.getAll)
    if TASK_SLOTS not in settings:
        try:
            settings[TASK_SLOTS] = str(int(spark.sparkContext.defaultParallelism))
        except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
            pass
    return settings


def _register_if_changed(spark: Any) -> None:
    """``write`` brings the session's settings (and task slots) to planning when they differ from what was
    registered."""
    settings = _planning_settings(spark)
    if settings != _registered.get(spark, {}):
        register(spark)


def drop_exchange(name: str, spark: Any = None, **options: str) -> dict:
    """Release an exchange and every partition it holds (``spark``: take that session's settings, and its
    plugin's coordinator, too). Asks the services already running; never starts one."""
    from .exchange import drop_exchange as _drop

    return _drop(name, _config(spark, options), jvm=_driver_jvm(spark))


def list_exchanges(spark: Any = None, **options: str) -> list[ExchangeSummary]:
    """A summary of each exchange and stream the coordinators hold (``spark``: take that session's
    settings, and its plugin's coordinator, too). Asks the services already running; [] when none runs
    (none is started). docs/operations.md lists the summary's fields."""
    from .exchange import list_exchanges as _list

    return [ExchangeSummary.from_description(d) for d in _list(_config(spark, options), jvm=_driver_jvm(spark))]


def _driver_jvm(spark: Any) -> int | None:
    """The pid of a classic session's driver JVM (its Spark plugin left the coordinator's address for it)."""
    if spark is None:
        return None
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - Spark Connect, or no JVM gateway: no plugin note to find
        return None


def leave_group(name: str, group: str, spark: Any = None, **options: str) -> dict:
    """Forget a stream's consumer group that is gone for good: it no longer holds epochs back."""
    from .spark.streaming import leave_group as _leave

    return _leave(_config(spark, {**options, "exchange": name}), group)


def _config(spark: Any, options: dict[str, str]) -> ExchangeConfig:
    return ExchangeConfig.load(options, session=session_settings(spark.conf.getAll) if spark is not None else None)


def write(df: Any, exchange: str, mode: str = "overwrite", **options: Any) -> None:
    """``df.write.format("pipelined")`` with numSubpartitions defaulting to the DataFrame's partition count.

    The session's ``spark.sparkflow.exchange.*`` settings reach planning (``register`` when they
    changed). For the write, Spark is told not to measure every Arrow batch after each row
    (``session_tuning``), unless the session sets that key itself. On Spark Connect the client cannot
    see the partition count (no ``df.rdd``), so numSubpartitions is left to the options and settings.
    A failure raises the package's class (``translate_errors``), whichever path served the write.
    """
    from .spark.session_tuning import is_connect, unchecked_arrow_batches

    session = df.sparkSession
    opts = {k: str(v) for k, v in options.items()}
    if not is_connect(session) and not any(k.lower() == "numsubpartitions" for k in opts):
        opts["numSubpartitions"] = str(df.rdd.getNumPartitions())
    _register_if_changed(session)
    if not is_connect(session):
        _activate(session)
    with unchecked_arrow_batches(session), translate_errors():  # a failed write raises the package's class
        df.write.format("pipelined").mode(mode).option("exchange", exchange).options(**opts).save()


def _activate(session: Any) -> None:
    """A write from a fresh thread needs the JVM's active session, or Spark cannot find the source."""
    try:
        session._jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(session._jsparkSession)
    except Exception:  # noqa: BLE001 - older Spark: nothing to set
        pass
