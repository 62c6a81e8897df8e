"""Exchanges between applications on a cluster of three hosts (tests/multihost.py): Spark standalone, the
services deployed as docs/deployment.md says (coordinator on host0, a service on each worker host), TLS
with host-name checks (which the jar's JVM writer, reader and catalog speak too), no hosts-file entries for the other hosts, applications configured by
spark-defaults.conf alone.

One cluster for the module (bringing it up takes a minute or two); the test that kills a service runs last.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import uuid

import multihost
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.multihost]

REASON = multihost.unavailable()
if REASON:
    pytestmark.append(pytest.mark.skip(reason=f"no simulated hosts here: {REASON}"))

KILL_BOUND = 30  # s: a read of data held by a killed host's service fails within this
EXPECTED = {"hash": {"rows": 20_000, "partitions": 4}, "broadcast": {"rows": 4 * 1_000, "partitions": 4},
            "forward": {"rows": 8_000, "partitions": 4}}  # app_multihost.py's exchanges, as read


@pytest.fixture(scope="module")
def cluster(jar):
    c = multihost.Cluster(hosts=3, keep=bool(os.environ.get("SPARKFLOW_MULTIHOST_KEEP")), jar=jar)
    # a SIGTERM (a CI timeout) interrupts the run like Ctrl-C, so the teardown below still runs
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        signal.signal(signal.SIGTERM, previous)


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


@pytest.fixture(scope="module")
def read_back(cluster, written) -> dict:
    """Application 2, started after application 1 ended, read the three exchanges."""
    prefix, _ = written
    return _ok(cluster, *cluster.app("read", prefix))


def test_a_later_application_reads_every_exchange_exactly(read_back):
    # each compared with what it must hold by chispa in the application, partition ids included
    exchanges = read_back["exchanges"]
    assert {name: {k: v for k, v in got.items() if k != "sums"} for name, got in exchanges.items()} == EXPECTED
    for name, got in exchanges.items():
        assert sum(rows for rows, _ in got["sums"].values()) == EXPECTED[name]["rows"]


def test_the_driver_lists_the_clusters_exchanges(written, read_back):
    prefix, _ = written
    assert read_back["listed"] == sorted(f"{prefix}-{name}" for name in [*EXPECTED, "cat"])


def test_the_jvm_writer_reader_and_catalog_serve_across_hosts_with_tls(read_back):
    # format("pipelined") and the catalog read in the JVM over TLS: the exchange's scan, no shuffle after it
    jvm = read_back["jvm"]
    for plan in (jvm["format_plan"], jvm["catalog_plan"]):
        assert "sparkflow-exchange" in plan and "(Python)" not in plan, plan
        assert "Exchange" not in plan.replace("sparkflow-exchange", ""), plan
    assert jvm["catalog_rows"] == EXPECTED["hash"]["rows"]


def test_status_on_a_worker_host_shows_the_clusters_services(cluster, written):
    proc = cluster.workers[0].run([str(multihost.Path(multihost.PYTHON).parent / "sparkflow-exchange"), "status"],
                                  timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    registry = proc.stdout[proc.stdout.index("services by host"):]
    for host in cluster.workers:
        assert host.name in registry and host.info["tcp"] in registry, registry


def test_a_coordinator_restart_between_write_and_read_loses_nothing(cluster, written, read_back):
    prefix, _ = written
    coordinator = cluster.hosts[0]
    cluster.kill_service(coordinator)
    cluster.start_service(coordinator)
    # every subpartition holds what application 2 read (exactly) before the restart
    result = _ok(cluster, *cluster.app("client-sums", prefix))
    assert result == {name: got["sums"] for name, got in read_back["exchanges"].items()}


def test_a_killed_hosts_service_fails_the_read_naming_the_host(cluster, written):
    prefix, _ = written
    victim = cluster.workers[-1]
    cluster.kill_service(victim)
    result = _ok(cluster, *cluster.app("client-read-failing", prefix, f"{KILL_BOUND}s"))
    assert "error" in result, f"the read did not fail: {result}"
    assert victim.ip in result["error"] or victim.name in result["error"], result["error"]
    # it failed on what it found (the host's service gone), not after waiting out readerTimeout
    assert "readerTimeout" not in result["error"] and "producerTimeout" not in result["error"], result["error"]
    assert result["seconds"] < KILL_BOUND, result
