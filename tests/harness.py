"""Real service processes on loopback for tests (started and stopped by pid), and fresh interpreters."""
import os
import subprocess
import sys

from sparkflow_exchange.service.process import RunningService, client_config, start_service, stop_embedded

__all__ = ["RunningService", "client_config", "fd_count", "fresh_python", "start_service", "stop_embedded"]


def fd_count(pid: int) -> int:
    """How many file descriptors process `pid` holds open (its /proc/<pid>/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def fresh_python(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (what it imports is its own), failing the test if it fails."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()
