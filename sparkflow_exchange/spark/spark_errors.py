"""How expected failures leave the Spark glue: ``sparkflow_exchange.<Error>: <message>``, no traceback.

Spark's Python worker prints the next error it reports as ``<class>: <message>`` only when
``SPARK_HIDE_TRACEBACK`` is set; the worker exits after reporting an error, so the setting never
outlives that failure. Light (no pyarrow): the streaming sink's per-batch commit process imports it.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Iterable, Iterator, TypeVar

from ..errors import UserFacing

USER_ERRORS = (UserFacing,)  # every error of sparkflow_exchange.errors (ServiceError, ExchangeReadError...)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def hide_traceback() -> None:
    os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def user_errors(fn: F) -> F:
    """An entry point Spark calls: expected failures reach the user without a traceback."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS:
            hide_traceback()
            raise
    return wrapper  # type: ignore[return-value]


def guarded(items: Iterable[T]) -> Iterator[T]:
    """:func:`user_errors` for a read's iterator (its errors happen while Spark iterates)."""
    try:
        yield from items
    except USER_ERRORS:
        hide_traceback()
        raise
