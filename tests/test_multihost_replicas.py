"""Replicas across three network-namespace hosts (tests/multihost.py, without Spark): an exchange written with
replicas=1 by clients on host1 and host2 is read to the last row exactly once, with the rows of each
subpartition as written, when host1's service is killed -9 during a read on host2, when host2 vanishes during a
read on host0 (its link cut, no reset, and its service killed), and by clients started after each loss; with the
workers' services gone, replicas=1 is refused at write time naming why."""
from __future__ import annotations

import json
import os
import signal

import multihost
import pytest
from replica_client import ROWS

pytestmark = [pytest.mark.multihost]

REASON = multihost.unavailable()
if REASON:
    pytestmark.append(pytest.mark.skip(reason=f"no simulated hosts here: {REASON}"))

CLIENT = str(multihost.TESTS / "replica_client.py")


class Hosts(multihost.Cluster):
    """The test cluster without Spark standalone; services find a lost one within a second or two."""

    def _spark(self) -> None:
        pass

    def spark_defaults(self, host) -> str:
        return super().spark_defaults(host) + ("spark.sparkflow.exchange.heartbeatInterval 0.2s\n"
                                               "spark.sparkflow.exchange.heartbeatTimeout 1.5s\n")


@pytest.fixture(scope="module")
def cluster():
    c = Hosts(hosts=3, keep=bool(os.environ.get("SPARKFLOW_MULTIHOST_KEEP")))
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        signal.signal(signal.SIGTERM, previous)


def _client(cluster, host, *args: str, timeout: float = 300) -> dict:
    proc = host.run([multihost.PYTHON, CLIENT, *args], timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:] + cluster.diagnostics()
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _exchange(cluster, name: str, failed_over: int = 0) -> dict:
    """The coordinator's description of ``name`` once ``failed_over`` of its partitions are read from replicas."""
    return _client(cluster, cluster.hosts[0], "describe", name, str(failed_over))


def _everything_once(result: dict) -> None:
    rows = sum(f["rows"] for f in result.values())
    assert rows == 2 * ROWS and sum(f["distinct"] for f in result.values()) == 2 * ROWS, result
    assert min(f["min"] for f in result.values()) == 0 and max(f["max"] for f in result.values()) == 2 * ROWS - 1


def test_a_replicated_exchange_survives_a_killed_service_during_and_before_a_read(cluster):
    h0, h1, h2 = cluster.hosts
    _client(cluster, h1, "write", "rep", "0", "overwrite")  # its partition on host1, its copy elsewhere
    _client(cluster, h2, "write", "rep", "1", "append")
    desc = _exchange(cluster, "rep")
    on_h1 = [p for p in desc["producers"] if p["location"]["host_id"] == h1.name]
    assert len(on_h1) == 1 and desc["replication"]["replicated"] == 2, desc
    copy = on_h1[0]["replicas"][0]["location"]
    assert copy["host_id"] != h1.name and on_h1[0]["replicas"][0]["state"] == "complete"
    before = _client(cluster, h0, "read", "rep")
    _everything_once(before)

    mid, go = h2.dir / "mid", h2.dir / "go"
    reader = h2.start("reader", [multihost.PYTHON, CLIENT, "read", "rep", str(mid), str(go)])
    try:
        multihost.wait_for("the reader on host2 is reading host1's partition", lambda: mid.exists() or
                           reader.poll() is not None, timeout=120)
        assert mid.exists(), h2.log("reader")
        cluster.kill_service(h1)  # kill -9 of host1's service in the middle of the read
        go.write_text("go")
        assert reader.wait(120) == 0, h2.log("reader")
    finally:
        if reader.poll() is None:
            multihost._end(reader.pid, reader)
    during = json.loads((h2.dir / "reader.out").read_text().strip().splitlines()[-1])
    assert during == before  # every row once, each in the subpartition it was written to

    # the coordinator finds host1 lost: its partition is read from the copy by clients started from now on
    after = _exchange(cluster, "rep", failed_over=1)
    moved = next(p for p in after["producers"] if p["partition"] == on_h1[0]["partition"])
    assert moved["location"]["service_id"] == copy["service_id"], moved
    assert after["replication"]["failed_over"] == 1
    assert _client(cluster, h0, "read", "rep") == before


def _alive(cluster, hosts: int) -> list[str]:
    """The hosts of the live services, once there are ``hosts`` of them."""
    return _client(cluster, cluster.hosts[0], "alive", str(hosts))


def test_a_replicated_exchange_survives_a_host_that_vanishes_during_a_read(cluster):
    h0, h1, h2 = cluster.hosts
    if "service" not in h1.procs:  # killed by the test before: host1 is back with a new service
        cluster.start_service(h1)
    assert _alive(cluster, 3) == [h0.name, h1.name, h2.name]
    _client(cluster, h2, "write", "rep2", "1", "overwrite")  # its partition on host2
    _client(cluster, h1, "write", "rep2", "0", "append")
    on_h2 = next(p for p in _exchange(cluster, "rep2")["producers"] if p["location"]["host_id"] == h2.name)
    before = _client(cluster, h0, "read", "rep2")
    _everything_once(before)

    mid, go = h0.dir / "mid2", h0.dir / "go2"
    reader = h0.start("reader2", [multihost.PYTHON, CLIENT, "read", "rep2", str(mid), str(go), "1"])
    try:
        multihost.wait_for("the reader on host0 is reading host2's partition", lambda: mid.exists() or
                           reader.poll() is not None, timeout=120)
        assert mid.exists(), h0.log("reader2")
        multihost._sh("ip", "link", "set", h2.veth, "down")  # host2 is cut off: nothing it sent arrives, no reset
        cluster.kill_service(h2)
        go.write_text("go")
        assert reader.wait(120) == 0, h0.log("reader2")
    finally:
        if reader.poll() is None:
            multihost._end(reader.pid, reader)
    assert json.loads((h0.dir / "reader2.out").read_text().strip().splitlines()[-1]) == before

    after = _exchange(cluster, "rep2", failed_over=1)
    moved = next(p for p in after["producers"] if p["partition"] == on_h2["partition"])
    assert moved["location"]["host_id"] == on_h2["replicas"][0]["location"]["host_id"] != h2.name, moved
    assert _client(cluster, h0, "read", "rep2") == before


def test_replicas_without_a_second_live_host_are_refused_at_write_time(cluster):
    h0, h1, h2 = cluster.hosts
    for host in (h1, h2):
        if "service" in host.procs:
            cluster.kill_service(host)
    assert _alive(cluster, 1) == [h0.name]
    proc = h0.run([multihost.PYTHON, CLIENT, "write", "alone", "0", "overwrite"], timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "InvalidRequest" in last and "replicas=1 needs live exchange services on 2 hosts" in last, last
    assert f"on 1 host ({h0.name})" in last, last
