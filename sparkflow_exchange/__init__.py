"""sparkflow-exchange: Flink's data exchange as a PySpark data source and sink, ``format("pipelined")``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"
__all__ = ["register", "drop_exchange", "list_exchanges", "write", "plugin_jar", "ExchangeConfig"]

from .config import ExchangeConfig


def register(spark: Any) -> None:
    """Register ``format("pipelined")`` on a session explicitly (installing the package already does)."""
    from .datasource import PipelinedDataSource

    spark.dataSource.register(PipelinedDataSource)


def drop_exchange(name: str, **options: str) -> dict:
    """Release an exchange and every partition it holds."""
    from .exchange import drop_exchange as _drop

    return _drop(name, ExchangeConfig.load(options))


def list_exchanges(**options: str) -> list[dict]:
    from .exchange import list_exchanges as _list

    return _list(ExchangeConfig.load(options))


def write(df: Any, exchange: str, mode: str = "overwrite", **options: Any) -> None:
    """``df.write.format("pipelined")`` with numSubpartitions defaulting to the DataFrame's partition count.

    For the write, Spark is told not to measure every Arrow batch after each
    row (``session_tuning``), unless the session sets that key itself.
    """
    from .session_tuning import unchecked_arrow_batches

    opts = {k: str(v) for k, v in options.items()}
    if not any(k.lower() == "numsubpartitions" for k in opts):
        opts["numSubpartitions"] = str(df.rdd.getNumPartitions())
    session = df.sparkSession
    _activate(session)
    with unchecked_arrow_batches(session):
        df.write.format("pipelined").mode(mode).option("exchange", exchange).options(**opts).save()


def _activate(session: Any) -> None:
    """A write from a fresh thread needs the JVM's active session, or Spark cannot find the source."""
    try:
        session._jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(session._jsparkSession)
    except Exception:  # noqa: BLE001 - Spark Connect or older Spark: nothing to set
        pass


def plugin_jar() -> str:
    """Path of the Spark plugin jar shipped in this package (for spark.jars)."""
    jar = Path(__file__).parent / "jars" / "sparkflow-exchange-plugin.jar"
    if not jar.exists():
        raise FileNotFoundError(
            f"{jar} is missing: this installation was built without a JDK. Build the jar with "
            "`python -m sparkflow_exchange.build_plugin` (needs javac 17 or newer and pyspark; "
            "`--output PATH` if the package directory is read-only)")
    return str(jar)
