"""The coordinator's registry of services (sans-IO, told the time by a clock the test moves)."""
from __future__ import annotations

import asyncio

import pytest

from sparkflow_exchange.errors import ErrorCode, InvalidRequest, ServiceError, error_for
from sparkflow_exchange.kinds import ServiceState
from sparkflow_exchange.service.coordinator import Coordinator
from sparkflow_exchange.service.registry import CHECK_PERIOD, ServiceRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def checked_for(registry: ServiceRegistry, clock: Clock, seconds: float) -> list:
    """The housekeeping's checks, every CHECK_PERIOD, for ``seconds``; the services lost meanwhile."""
    lost = []
    for _ in range(int(seconds / CHECK_PERIOD)):
        clock.now += CHECK_PERIOD
        lost += registry.expire()
    return lost


def test_a_service_silent_for_the_timeout_is_lost_and_one_that_beats_is_not():
    clock = Clock()
    registry = ServiceRegistry(5.0, clock)
    registry.register("svc-a", "hostA", "10.0.0.1:7338", "unix:/a", 11)
    registry.register("svc-b", "hostB", "10.0.0.2:7338", "unix:/b", 12)
    lost = []
    for _ in range(10):  # 10 s: b beats every second, a is silent
        lost += checked_for(registry, clock, 1.0)
        assert registry.heartbeat("svc-b")
    assert [r.service_id for r in lost] == ["svc-a"]
    assert registry.services["svc-a"].state == ServiceState.LOST
    assert "heartbeatTimeout=5 s" in registry.services["svc-a"].lost_reason
    assert registry.services["svc-b"].state == ServiceState.ALIVE
    assert not registry.heartbeat("svc-a")  # a lost service must register again
    described = {d["service_id"]: d for d in registry.describe()}
    assert described["svc-a"]["state"] == "lost" and described["svc-b"]["state"] == "alive"


def test_a_stall_of_the_coordinators_own_loop_loses_no_service():
    clock = Clock()
    registry = ServiceRegistry(5.0, clock)
    registry.register("svc-a", "hostA", "10.0.0.1:7338", "unix:/a", 11)
    checked_for(registry, clock, 2.0)
    clock.now += 30.0  # the loop ran nothing for 30 s: the heartbeats wait unread in the socket
    assert registry.expire() == []
    assert registry.heartbeat("svc-a")
    # a service that is really gone is still found lost, after the timeout of checks that run
    assert [r.service_id for r in checked_for(registry, clock, 6.0)] == ["svc-a"]


def test_a_new_process_at_a_services_address_makes_the_old_one_lost():
    registry = ServiceRegistry(5.0, Clock())
    registry.register("svc-old", "hostA", "10.0.0.1:7338", "unix:/a", 11)
    replaced = registry.register("svc-new", "hostA", "10.0.0.1:7338", "unix:/a", 12)
    assert [r.service_id for r in replaced] == ["svc-old"]
    assert "restarted" in registry.services["svc-old"].lost_reason
    assert registry.services["svc-new"].state == ServiceState.ALIVE


def test_records_taken_up_after_a_restart_get_a_full_timeout_to_register_again():
    clock = Clock()
    before = ServiceRegistry(5.0, clock)
    before.register("svc-a", "hostA", "10.0.0.1:7338", "unix:/a", 11)
    clock.now += 100.0
    after = ServiceRegistry(5.0, clock)
    after.restore(before.snapshot())
    assert checked_for(after, clock, 4.0) == []
    assert after.heartbeat("svc-a")
    assert [r.service_id for r in checked_for(after, clock, 6.0)] == ["svc-a"]


def test_a_producer_location_is_taken_from_the_registry_or_refused():
    """register_producer keeps the registered addresses of the service a location names; a location naming no
    registered service, a lost one, or another address than it registered is refused (unregistered_service)."""
    coord = Coordinator(lambda targets, reason="", code="": None)
    coord.services.register("svc-a", "hostA", "10.0.0.1:7338", "unix:/a", 11)
    coord.services.register("svc-b", "hostB", "10.0.0.2:7338", "unix:/b", 12)
    coord.services.services["svc-b"].state = ServiceState.LOST
    coord.services.services["svc-b"].lost_reason = "it sent no heartbeat"

    def refused(location: dict) -> str:
        with pytest.raises(ServiceError) as info:
            coord.registered_location(location)
        exc = error_for(info.value.code, str(info.value))  # what the client raises for it
        assert isinstance(exc, InvalidRequest) and exc.code == ErrorCode.UNREGISTERED_SERVICE
        return str(exc)

    assert "'svc-x', which is not a registered exchange service" in refused({"service_id": "svc-x"})
    assert "declared lost (it sent no heartbeat)" in refused({"service_id": "svc-b", "tcp": "10.0.0.2:7338"})
    assert "at tcp address '10.0.0.9:1', but it registered '10.0.0.1:7338'" in \
        refused({"service_id": "svc-a", "tcp": "10.0.0.9:1"})
    assert "at unix address 'unix:/elsewhere'" in refused({"service_id": "svc-a", "unix": "unix:/elsewhere"})
    assert refused({}) and refused({"service_id": 7})
    kept = coord.registered_location({"service_id": "svc-a", "tcp": "10.0.0.1:7338", "host_id": "not-hostA",
                                      "pid": 1, "tls": False, "spill_dir": "/etc", "extra": "x" * 1000})
    assert kept == {"service_id": "svc-a", "host_id": "hostA", "tcp": "10.0.0.1:7338", "unix": "unix:/a",
                    "pid": 11, "tls": False}

    async def join() -> dict:  # and through register_producer, into what readers are told
        d = await coord.declare("x", "schema", 1, {"name": "forward"}, "HYBRID", "overwrite")
        await coord.register_producer("x", d["epoch"], d["write_id"], 0, "a0", "p0", {"service_id": "svc-a"})
        return coord.exchanges["x"].describe()

    [producer] = asyncio.run(join())["producers"]
    assert producer["location"]["tcp"] == "10.0.0.1:7338" and producer["location"]["unix"] == "unix:/a"


def test_a_lost_service_is_forgotten_after_the_retention_counted_from_its_loss_even_across_a_restart():
    clock, wall = Clock(), Clock()
    registry = ServiceRegistry(5.0, clock, wall)
    registry.register("svc-a", "hostA", "10.0.0.1:7338", "unix:/a", 11)
    wall.now += 3600.0  # registered long ago: the retention counts from the loss, not the registration
    clock.now += 1.0
    lost = checked_for(registry, clock, 6.0)
    assert [r.service_id for r in lost] == ["svc-a"] and lost[0].lost_at == wall.now
    assert registry.forget_lost(60.0) == []  # listed for the retention
    wall.now += 59.0
    assert registry.forget_lost(60.0) == []
    after = ServiceRegistry(5.0, clock, wall)  # a coordinator restart keeps when it was lost
    after.restore(registry.snapshot())
    assert after.services["svc-a"].state == ServiceState.LOST and after.forget_lost(60.0) == []
    wall.now += 1.0
    assert [r.service_id for r in after.forget_lost(60.0)] == ["svc-a"]
    assert after.describe() == [] and after.forget_lost(60.0) == []
