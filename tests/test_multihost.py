"""Exchanges between applications on a cluster of three hosts (tests/multihost.py): Spark standalone, the
services deployed as docs/deployment.md says (coordinator on host0, a service on each worker host), TLS
with host-name checks, no hosts-file entries for the other hosts, applications configured by
spark-defaults.conf alone.

One cluster for the module (bringing it up takes a minute or two); the test that kills a service runs last.
"""
from __future__ import annotations

import ipaddress
import os
import uuid

import pytest

import multihost

pytestmark = [pytest.mark.spark, pytest.mark.multihost]

REASON = multihost.unavailable()
if REASON:
    pytestmark.append(pytest.mark.skip(reason=f"no simulated hosts here: {REASON}"))

KILL_BOUND = 30  # s: no wait of a read of data held by a killed host's service lasts longer
EXPECTED = {"hash": {"rows": 100_000, "partitions": 4}, "broadcast": {"rows": 4 * 5_000, "partitions": 4},
            "forward": {"rows": 40_000, "partitions": 4}}  # app_multihost.py's exchanges, as read
HANG_BOUND = 600.0  # s: a bound for a hang, not for a loaded machine's pace (Spark schedules and retries the tasks)


@pytest.fixture(scope="module")
def cluster(jar):
    c = multihost.Cluster(hosts=3, keep=bool(os.environ.get("SPARKFLOW_MULTIHOST_KEEP")), jar=jar)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _ok(cluster, result, proc) -> dict:
    assert proc.returncode == 0 and result is not None, \
        proc.stdout[-3000:] + proc.stderr[-6000:] + cluster.diagnostics()
    return result


@pytest.fixture(scope="module")
def written(cluster) -> tuple[str, dict]:
    """Application 1 wrote the three exchanges and ended."""
    prefix = f"mh-{uuid.uuid4().hex[:8]}"
    return prefix, _ok(cluster, *cluster.app("write", prefix))


def test_services_advertise_addresses_other_hosts_reach(cluster):
    for host in cluster.hosts:
        advertised = host.info["tcp"]
        port = multihost.COORDINATOR_PORT if host.index == 0 else multihost.SERVICE_PORT
        assert advertised == f"{host.ip}:{port}", host.info
        assert not ipaddress.ip_address(advertised.rsplit(":", 1)[0]).is_loopback
        assert host.info["tls"] is True


def test_exchanges_are_written_across_both_workers(cluster, written):
    _, placed = written
    services = {(h.name, h.info["tcp"]) for h in cluster.workers}
    for name, holders in placed.items():
        # every producer's partition is held by a worker host's own service, and both hosts hold some
        assert {tuple(h) for h in holders} == services, (name, holders)


def test_a_later_application_reads_every_exchange_exactly(cluster, written):
    prefix, _ = written
    result = _ok(cluster, *cluster.app("read", prefix))  # each compared with chispa, partition ids included
    assert result == EXPECTED


def test_a_coordinator_restart_between_write_and_read_loses_nothing(cluster, written):
    prefix, _ = written
    coordinator = cluster.hosts[0]
    cluster.kill_service(coordinator)
    cluster.start_service(coordinator)
    result = _ok(cluster, *cluster.app("read", prefix))
    assert result == EXPECTED


def test_a_killed_hosts_service_fails_the_read_naming_the_host(cluster, written):
    prefix, _ = written
    victim = cluster.workers[-1]
    cluster.kill_service(victim)
    result, proc = cluster.app("read-failing", prefix, f"{KILL_BOUND}s")
    result = _ok(cluster, result, proc)
    assert "error" in result, f"the read did not fail: {result}"
    assert victim.ip in result["error"] or victim.name in result["error"], result["error"]
    # it failed on what it found (the host's service gone), not after waiting out readerTimeout
    assert "readerTimeout" not in result["error"] and "producerTimeout" not in result["error"], result["error"]
    assert result["seconds"] < HANG_BOUND, result
