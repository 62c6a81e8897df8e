"""An exchange's description from the coordinator, asked with the light client.

Spark plans a read in short-lived planning workers (the schema, then the read plan): what they import is paid
by every read of a fresh application. This module imports neither Arrow nor the data path; the schema stays
the base64 Arrow IPC message it was declared with (``exchange.describe_exchange`` decodes it).
"""
from __future__ import annotations

import logging

from .calls import call, require_name
from .config import ExchangeConfig
from .errors import ErrorCode, ExchangeNotFound, ServiceError

log = logging.getLogger(__name__)


def describe(config: ExchangeConfig, *, wait: bool = True, allow_stream: bool = False) -> dict:
    """The exchange (schema, numSubpartitions...), waiting up to declareTimeout for it to be declared.

    ``allow_stream``: a stream's description (``kind: stream``) is an answer too (for its schema)."""
    name = require_name(config)
    timeout = config.declare_timeout if wait else 0.0
    extra = {"allow_stream": True} if allow_stream else {}
    ask = {"name": name, "need_subpartitions": True, **extra}
    try:  # first without waiting: a read of a misspelt name says at once what it waits for
        return call(config, "get_exchange", timeout=30, wait=0.0, **ask)
    except ServiceError as exc:
        if timeout <= 0 or exc.code not in (ErrorCode.NO_EXCHANGE, ErrorCode.NO_SUBPARTITIONS):
            raise
        if isinstance(exc, ExchangeNotFound):
            log.warning("exchange %r is not declared yet: waiting up to %g s (declareTimeout) for a writer to "
                        "declare it", name, timeout)
        return call(config, "get_exchange", timeout=timeout + 30, wait=timeout, **ask)


def sealed_producers(desc: dict) -> list[dict] | None:
    """The committed producers of a description taken when the exchange was sealed (the read plan), else None."""
    if not desc.get("sealed"):
        return None
    committed = set(desc.get("committed", ()))
    return [p for p in desc.get("producers", ()) if p["partition"] in committed]
