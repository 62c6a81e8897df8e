"""The errors a user sees, named for what went wrong.

Spark prints a Python data source's failure as ``<module>.<class>: <message>`` (below its own
``PYTHON_DATA_SOURCE_ERROR`` line), so the classes carry the short module name
``sparkflow_exchange`` (where they are exported) and a name that says the problem. Errors that are
the user's to fix are :class:`UserFacing`: the Spark glue prints them without a Python traceback.
Standard library only.
"""
from __future__ import annotations


class UserFacing(Exception):
    """Marker: an expected failure whose message says everything; no traceback is shown for it."""


class ConfigError(UserFacing, ValueError):
    """A setting or option is unknown or has a value that cannot be used."""


class ExchangeError(UserFacing, RuntimeError):
    """A user-facing failure of an exchange operation; the message names the problem."""


class ExchangeNotFound(ExchangeError):
    """No exchange of that name was declared within declareTimeout."""


class ExchangeLost(ExchangeError):
    """The exchange's data went with a service that ended unexpectedly (killed or crashed)."""


class ExchangeReplaced(ExchangeError):
    """The exchange was overwritten or dropped (or expired) while this write or read was using it."""


class SchemaMismatch(ConfigError, ExchangeError):
    """A read's given schema, or an append's schema, differs from the exchange's."""


for _cls in (UserFacing, ConfigError, SchemaMismatch, ExchangeError, ExchangeNotFound, ExchangeLost, ExchangeReplaced):
    _cls.__module__ = "sparkflow_exchange"
