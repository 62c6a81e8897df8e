"""The coordinator's registry of services (sans-IO, told the time by a clock the test moves)."""
from __future__ import annotations

from sparkflow_exchange.kinds import ServiceState
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
