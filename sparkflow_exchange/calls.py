"""One call to the coordinator (its refusals arrive as the errors users read: ``errors.error_for``), and the
call every read makes first: :func:`describe`.

Light on purpose (no pyarrow, no data path): a streaming writer's commit runs in a fresh Python
process for every micro-batch, and what it imports is paid by every micro-batch.
"""
from __future__ import annotations

import logging
from typing import Any

from .config import ConfigError, ExchangeConfig
from .description import ExchangeDescription
from .errors import ErrorCode, ExchangeNotFound, ServiceError
from .service.discovery import resolve

log = logging.getLogger(__name__)


def call(config: ExchangeConfig, method: str, timeout: float | None = None, **args: Any) -> Any:
    ep = resolve(config)
    with ep.connect(ep.coordinator, config) as conn:
        return conn.call(method, timeout=timeout, **args)


def require_name(config: ExchangeConfig) -> str:
    """The exchange's name, or a ConfigError saying the option is required."""
    if not config.exchange:
        raise ConfigError("the 'exchange' option is required: .option('exchange', '<name>')")
    return config.exchange


def describe(config: ExchangeConfig, *, wait: bool = True, allow_stream: bool = False) -> ExchangeDescription:
    """The exchange (schema, numSubpartitions...), waiting up to declareTimeout for it to be declared.

    ``allow_stream``: a stream's description (``kind: stream``) is an answer too (for its schema)."""
    name = require_name(config)
    timeout = config.declare_timeout if wait else 0.0
    extra = {"allow_stream": True} if allow_stream else {}
    ask = {"name": name, "need_subpartitions": True, **extra}
    try:  # first without waiting: a read of a misspelt name says at once what it waits for
        return ExchangeDescription.parse(call(config, "get_exchange", timeout=30, wait=0.0, **ask))
    except ServiceError as exc:
        if timeout <= 0 or exc.code not in (ErrorCode.NO_EXCHANGE, ErrorCode.NO_SUBPARTITIONS):
            raise
        if isinstance(exc, ExchangeNotFound):
            log.warning("exchange %r is not declared yet: waiting up to %g s (declareTimeout) for a writer to "
                        "declare it", name, timeout)
        return ExchangeDescription.parse(call(config, "get_exchange", timeout=timeout + 30, wait=timeout, **ask))
