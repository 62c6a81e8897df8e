"""Spark settings that decide how fast rows reach a Python data source, and the one we set per write.

:data:`SPARK_SETTINGS` are for the session builder (``.config(map=...)``) or ``spark-defaults.conf``;
the first can only be set before the session starts:

* ``spark.python.unix.domain.socket.enabled=true``: Spark talks to its Python workers over TCP on
  loopback by default, with Nagle's algorithm on at both ends. A Python data source task is a few small
  writes each way, and twice per task a small write waits for the peer's delayed ACK: measured on
  ``local[2]``, a worker waited ~42 ms for its command and ~42 ms for its input in every task, about 90 ms
  of a task whose own work is 0.3-6 ms (a 200-task read: 8.6-9.2 s, with Unix sockets 1.6-2.5 s).
  Unix sockets have no Nagle. Spark's own fix of the same stall elsewhere: SPARK-51667.
* ``spark.sql.execution.arrow.maxBytesPerBatch=2147483647``: see below.

When Spark feeds a ``DataSourceArrowWriter`` it fills each Arrow batch row by
row and, unless ``spark.sql.execution.arrow.maxBytesPerBatch`` is exactly
``Int.MaxValue``, measures the whole batch after every row to enforce that
limit. The measurement walks every column vector; profiled on the benchmark's
write (JFR), it was about a third of the JVM's time, more than converting the
rows to Arrow. At ``Int.MaxValue`` Spark skips it and batches are bounded by
``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000 rows by default)
alone, as they were before Spark 4.

:func:`unchecked_arrow_batches` turns the check off for the duration of one
write unless the user set the key, and puts the session back afterwards, so
``sparkflow_exchange.write`` is fast without changing the session under the
user. Concurrent writes in one session share the setting (counted).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

ARROW_MAX_BYTES_PER_BATCH = "spark.sql.execution.arrow.maxBytesPerBatch"
UNCHECKED = "2147483647"  # Int.MaxValue: the only value at which Spark skips the per-row measurement
PYTHON_WORKER_UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"

# exported as sparkflow_exchange.SPARK_SETTINGS
SPARK_SETTINGS: dict[str, str] = {PYTHON_WORKER_UNIX_SOCKETS: "true", ARROW_MAX_BYTES_PER_BATCH: UNCHECKED}

_lock = threading.Lock()
_writes_holding: dict[int, int] = {}  # id(session) -> writes in flight that set the key
# Spark Connect: a value Spark never has, to tell "not set by the user" (get returns the default given)
# from the built-in default; a valid value (Spark checks the default it is given) no one sets
_NOT_SET = "2147483601"


def is_connect(session: Any) -> bool:
    """A Spark Connect session: no JVM in this process (no _jvm, no sparkContext, no df.rdd)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def _sql_conf(session: Any) -> Any | None:
    """The session's JVM SQLConf (explicitly set keys are visible there), or None without one."""
    try:
        return session._jsparkSession.sessionState().conf()
    except Exception:  # noqa: BLE001 - an older or unusual session: leave it alone
        return None


def _user_set(session: Any) -> bool | None:
    """Whether the session sets the key itself; None when that cannot be told (then nothing is changed)."""
    if is_connect(session):  # through the Connect client's conf API, never _jvm
        return session.conf.get(ARROW_MAX_BYTES_PER_BATCH, _NOT_SET) != _NOT_SET
    conf = _sql_conf(session)
    return None if conf is None else bool(conf.contains(ARROW_MAX_BYTES_PER_BATCH))


@contextmanager
def unchecked_arrow_batches(session: Any) -> Iterator[bool]:
    """Within the block, Spark does not measure Arrow batches per row; yields whether this call set it."""
    key = id(session)
    with _lock:
        holders = _writes_holding.get(key, 0)
        mine = holders > 0 or _user_set(session) is False  # the user's own value wins
        if mine:
            if holders == 0:
                session.conf.set(ARROW_MAX_BYTES_PER_BATCH, UNCHECKED)
            _writes_holding[key] = holders + 1
    try:
        yield mine
    finally:
        if mine:
            with _lock:
                holders = _writes_holding.pop(key) - 1
                if holders:
                    _writes_holding[key] = holders
                else:
                    session.conf.unset(ARROW_MAX_BYTES_PER_BATCH)
