"""A lost service is said once and forgotten after lostServiceRetention: a coordinator's status does not
list it forever, and a restarted coordinator does not warn again about services lost before."""
from __future__ import annotations

import os
import signal
import socket
import time

from harness import start_service

FAST = {"heartbeatInterval": "0.2s", "heartbeatTimeout": "1s"}
LOG = {"SPARKFLOW_EXCHANGE_LOG": "INFO"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _state(coordinator, service_id: str) -> str | None:
    return {s["service_id"]: s["state"] for s in coordinator.status()["services"]}.get(service_id)


def _until(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _crashed_worker(tmp_path, coordinator, name: str) -> str:
    """A service reporting to ``coordinator``, killed -9; its service id once the coordinator lists it lost."""
    worker = start_service(tmp_path / name, coordinator=False, host_id=name, conf={**FAST, "coordinator": coordinator.tcp})
    service_id = worker.info["service_id"]
    _until("the worker registered", lambda: _state(coordinator, service_id) == "alive")
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait(30)
    _until("the worker declared lost", lambda: _state(coordinator, service_id) == "lost")
    return service_id


def _lines(svc, *words: str) -> list[str]:
    return [line for line in (svc.home / "service.log").read_text().splitlines() if all(w in line for w in words)]


def test_a_lost_service_is_forgotten_after_the_retention_with_one_line_each(tmp_path):
    coordinator = start_service(tmp_path / "coordinator", conf={**FAST, "lostServiceRetention": "2s"}, env=LOG)
    try:
        service_id = _crashed_worker(tmp_path, coordinator, "worker")
        _until("the lost worker forgotten", lambda: _state(coordinator, service_id) is None, timeout=30)
        time.sleep(1.0)  # some more housekeeping rounds: nothing more is said about it
        assert len(_lines(coordinator, service_id, "is lost")) == 1
        assert len(_lines(coordinator, f"forgot the exchange service {service_id}", "lostServiceRetention=2 s")) == 1
    finally:
        coordinator.stop()


def test_a_restarted_coordinator_lists_services_lost_before_without_warning_again(tmp_path):
    port = _free_port()
    conf = {**FAST, "lostServiceRetention": "1h"}
    state = ["--state-dir", str(tmp_path / "state")]
    first = start_service(tmp_path / "first", port=port, conf=conf, extra=state, env=LOG)
    try:
        service_id = _crashed_worker(tmp_path, first, "worker")
    finally:
        assert first.stop() == 0
    second = start_service(tmp_path / "second", port=port, conf=conf, extra=state, env=LOG)
    try:
        assert _state(second, service_id) == "lost"  # still listed: lost within the retention
        time.sleep(1.5)  # past a heartbeatTimeout of housekeeping
        assert _lines(second, service_id, "is lost") == [] and not _lines(second, "WARNING", service_id)
        assert _lines(second, "lost exchange services from before the restart are listed")
    finally:
        second.stop()
