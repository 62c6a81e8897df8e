"""One call to the coordinator (its refusals arrive as the errors users read: ``errors.error_for``).

Light on purpose (no pyarrow, no data path): a streaming writer's commit runs in a fresh Python
process for every micro-batch, and what it imports is paid by every micro-batch.
"""
from __future__ import annotations

from typing import Any

from .config import ConfigError, ExchangeConfig
from .service.discovery import resolve


def call(config: ExchangeConfig, method: str, timeout: float | None = None, **args: Any) -> Any:
    ep = resolve(config)
    with ep.connect(ep.coordinator, config) as conn:
        return conn.call(method, timeout=timeout, **args)


def require_name(config: ExchangeConfig) -> str:
    """The exchange's name, or a ConfigError saying the option is required."""
    if not config.exchange:
        raise ConfigError("the 'exchange' option is required: .option('exchange', '<name>')")
    return config.exchange
