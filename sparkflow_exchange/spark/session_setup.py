"""``configure(builder)``: a session builder that loads the plugin jar, so ``format("pipelined")`` takes the JVM path.

Why a builder call and not something done after the session starts: Spark looks ``format("pipelined")`` up
through the planning thread's context class loader. ``ADD JAR`` after the start puts the jar on the class
loader of the one thread that ran it; a query planned on any other thread still finds only the Python data
source (docs/batch-guide.md, "Loading the jar into a running session"). ``spark.jars`` given before the start
puts it on the driver's and every executor's class path.

The call merges, it never overrides: the jar is appended to the ``spark.jars`` the builder (or, without one,
spark-defaults.conf and ``PYSPARK_SUBMIT_ARGS``'s ``--jars``) already has, and each recommended setting is
added only where neither the builder nor spark-defaults.conf has the key. Calling it twice changes nothing.
It also appends the jar's warm-up to ``spark.sql.extensions`` (merged the same way): when the session starts,
a daemon thread does a write's one-time work (loading Arrow's classes, a few thousand rows through the
encoder) and a local application without a service starts the embedded one, so the application's first write
pays neither.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from ..config import read_spark_defaults
from ..errors import ConfigError
from .session_tuning import ARROW_MAX_BYTES_PER_BATCH, UNCHECKED

JARS = "spark.jars"
JAR_NAME = "sparkflow-exchange-plugin.jar"
EXTENSIONS = "spark.sql.extensions"
# starts the jar's one warm-up of the write path when the session starts (WarmupExtension.java): a fresh
# application's first JVM write otherwise pays for loading Arrow's classes and a cold row loop
WARMUP_EXTENSION = "org.sparkflow.exchange.format.WarmupExtension"

# The settings the batch guide recommends for the JVM path (docs/batch-guide.md, "format("pipelined") with the
# jar" and "Spark settings for speed"). Neither can be set by the jar itself: both are the session's.
RECOMMENDED: dict[str, str] = {
    # a join of a key-grouped exchange read with any other relation on its key shuffles only the other side
    "spark.sql.sources.v2.bucketing.shuffle.enabled": "true",
    # the Python path's writes: Spark skips measuring every Arrow batch after each row (session_tuning.py)
    ARROW_MAX_BYTES_PER_BATCH: UNCHECKED,
}


def _split(jars: str | None) -> list[str]:
    return [j.strip() for j in (jars or "").split(",") if j.strip()]


def _submit_args() -> dict[str, str]:
    """The settings ``PYSPARK_SUBMIT_ARGS`` (PySpark's route to spark-submit) gives: ``--jars`` as ``spark.jars``,
    and each ``--conf key=value``."""
    try:
        args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    except ValueError:
        return {}
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        value = args[i + 1] if i + 1 < len(args) else ""
        if arg == "--jars":
            found[JARS] = value
        elif arg.startswith("--jars="):
            found[JARS] = arg.split("=", 1)[1]
        elif arg == "--conf" and "=" in value:
            key, _, v = value.partition("=")
            found.setdefault(key.strip(), v)
    return found


def _remote(options: dict[str, Any]) -> str | None:
    """The Spark Connect URL the builder will connect to, or None for a classic session."""
    url = options.get("spark.remote") or os.environ.get("SPARK_REMOTE")
    return str(url) if url else None


def _active_context_jars() -> list[str] | None:
    """The running classic SparkContext's ``spark.jars`` (it can no longer change), or None without one."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    sc = SparkContext._active_spark_context
    if sc is None:
        return None
    return _split(sc.getConf().get(JARS, ""))


def _file_name(entry: str) -> str:
    """The file name of a ``spark.jars`` entry: a path or a URL (``file:``, ``local:``, ``hdfs://...``)."""
    return entry.rstrip("/").rsplit("/", 1)[-1]


def merged_jars(existing: str | None, jar: str) -> str:
    """``existing`` with ``jar`` appended, unless a plugin jar is in it already (the user's copy wins)."""
    entries = _split(existing)
    if any(_file_name(e) == JAR_NAME for e in entries):
        return ",".join(entries)
    return ",".join([*entries, jar])


def merged_extensions(existing: str | None) -> str:
    """``existing`` (a comma-separated list of extension classes) with the warm-up's appended, once."""
    entries = _split(existing)
    return ",".join(entries if WARMUP_EXTENSION in entries else [*entries, WARMUP_EXTENSION])


def settings_to_add(options: dict[str, Any], *, jar: str, spark_defaults: dict[str, str], submit: dict[str, str],
                    running_jars: list[str] | None, remote: str | None, settings: bool = True) -> dict[str, str]:
    """The keys ``configure`` adds to a builder whose options are ``options`` (nothing here touches Spark).

    ``running_jars``: the ``spark.jars`` of a classic SparkContext already running (None without one);
    ``submit``: what ``PYSPARK_SUBMIT_ARGS`` sets (``--jars``, ``--conf``; it wins over spark-defaults.conf, as in
    spark-submit); ``remote``: the builder's Spark Connect URL (None for a classic session)."""
    add: dict[str, str] = {}
    if remote is None or remote.startswith("local"):  # a classic session, or Connect's in-process local server
        if running_jars is not None and remote is None:
            if not any(_file_name(j) == JAR_NAME for j in running_jars):
                raise ConfigError(
                    "a SparkContext is already running without the plugin jar, and spark.jars cannot change in it: "
                    "call sparkflow_exchange.configure(builder) before the application's first session starts "
                    "(or stop the running one first)")
        else:
            for key, merge in ((JARS, lambda v: merged_jars(v, jar)), (EXTENSIONS, merged_extensions)):
                existing = options.get(key)
                if existing is None:  # the builder's value replaces the launcher's: keep the launcher's entries
                    existing = submit.get(key, spark_defaults.get(key))
                merged = merge(None if existing is None else str(existing))
                if merged != options.get(key):
                    add[key] = merged
    if settings:
        for key, value in RECOMMENDED.items():
            if key not in options and key not in submit and key not in spark_defaults:
                add[key] = value
    return add


def configure(builder: Any, *, settings: bool = True) -> Any:
    """Return ``builder`` set up for the JVM path: the plugin jar merged into ``spark.jars`` and, with
    ``settings``, the recommended Spark settings the builder and spark-defaults.conf do not already set.

    Call it before the application's first session starts: ``configure(SparkSession.builder).getOrCreate()``.
    A Spark Connect builder of a remote server (``sc://``) gets the settings only: the jar must be on that
    server. Raises :class:`ConfigError` when a classic SparkContext already runs without the jar (its
    ``spark.jars`` cannot change any more)."""

    options = getattr(builder, "_options", None)
    if not isinstance(options, dict):
        raise ConfigError(f"configure() takes a SparkSession builder (SparkSession.builder), got {type(builder).__name__}")
    remote = _remote(options)
    add = settings_to_add(options, jar=plugin_jar(), spark_defaults=read_spark_defaults(),
                          submit=_submit_args(), running_jars=_active_context_jars() if remote is None else None,
                          remote=remote, settings=settings)
    return builder.config(map=add) if add else builder


def plugin_jar() -> str:
    """Path of the Spark plugin jar shipped in this package (for spark.jars)."""
    jar = Path(__file__).resolve().parent.parent / "jars" / "sparkflow-exchange-plugin.jar"
    if not jar.exists():
        raise FileNotFoundError(
            f"{jar} is missing: this installation was built without a JDK. Build the jar with "
            "`python -m sparkflow_exchange.build_plugin` (needs javac 17 or newer and pyspark; "
            "`--output PATH` if the package directory is read-only)")
    return str(jar)
