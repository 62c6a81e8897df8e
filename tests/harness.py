"""Real service processes on loopback for tests (started and stopped by pid), and fresh interpreters."""
import subprocess
import sys

from sparkflow_exchange.service.process import RunningService, client_config, start_service, stop_embedded

__all__ = ["RunningService", "client_config", "fresh_python", "start_service", "stop_embedded"]


def fresh_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (what it imports is its own), failing the test if it fails."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()
