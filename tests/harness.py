"""Real service processes on loopback for tests (started and stopped by pid)."""
from sparkflow_exchange.service.process import RunningService, client_config, start_service, stop_embedded

__all__ = ["RunningService", "client_config", "start_service", "stop_embedded"]
