"""One call to the coordinator, its error codes turned into the errors users read.

Light on purpose (no pyarrow, no data path): a streaming writer's commit runs in a fresh Python
process for every micro-batch, and what it imports is paid by every micro-batch.
"""
from __future__ import annotations

from typing import Any

from .config import ConfigError, ExchangeConfig
from .errors import ExchangeError, ExchangeLost, ExchangeNotFound, ExchangeReplaced, SchemaMismatch
from .network.blocking_client import ServiceError
from .service.discovery import resolve

# the coordinator's error codes that have a class of their own (the name the user reads first)
ERRORS_BY_CODE = {"no_exchange": ExchangeNotFound, "exchange_lost": ExchangeLost, "schema_mismatch": SchemaMismatch,
                  "replaced": ExchangeReplaced}


def call(config: ExchangeConfig, method: str, timeout: float | None = None, **args: Any) -> Any:
    ep = resolve(config)
    with ep.connect(ep.coordinator, config) as conn:
        try:
            return conn.call(method, timeout=timeout, **args)
        except ServiceError as exc:
            raise ERRORS_BY_CODE.get(exc.code, ExchangeError)(str(exc)) from None


def require_name(config: ExchangeConfig) -> str:
    """The exchange's name, or a ConfigError saying the option is required."""
    if not config.exchange:
        raise ConfigError("the 'exchange' option is required: .option('exchange', '<name>')")
    return config.exchange
