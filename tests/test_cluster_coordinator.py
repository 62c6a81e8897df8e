"""A coordinator of the operator's with services that register and heartbeat, and its state directory.

Real processes on loopback: one coordinator (``serve`` with ``stateDir``) and two partition services
(``serve --no-coordinator``) playing two hosts (``hostId``). Heartbeats are fast here (0.3 s, lost after
4 s) so a loss is seen quickly; every wait is bounded generously for a loaded machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config, start_service

import sparkflow_exchange as sfx
from sparkflow_exchange import client
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.calls import call
from sparkflow_exchange.network.protocol import PartitionRegistered, RegisterPartition

BEAT = {"heartbeatInterval": "0.3", "heartbeatTimeout": "4"}
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
WAIT = 90.0  # s: a bound for a loaded machine, not a pace


def table(start: int, rows: int) -> pa.Table:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table({"id": ids, "v": pa.array([f"row-{i}" for i in ids])}, schema=SCHEMA)


class Cluster:
    """A coordinator with a state directory and two services that report to it, each its own 'host'."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.coordinator = start_service(tmp / "coordinator", host_id="coordhost",
                                         conf={"stateDir": str(self.state), **BEAT})
        self.port = int(self.coordinator.tcp.rsplit(":", 1)[1])
        self.hosts = {name: start_service(tmp / name, host_id=name, coordinator=False,
                                          conf={"coordinator": self.coordinator.tcp, **BEAT})
                      for name in ("hostA", "hostB")}
        self.wait_services(lambda s: all(s.get(h.info["service_id"]) == "alive" for h in self.hosts.values()))

    def restart_coordinator(self) -> None:
        """kill -9, then a new process on the same port with the same state directory."""
        self.coordinator.stop(signal.SIGKILL)
        self.coordinator = start_service(self.tmp / "coordinator", host_id="coordhost", port=self.port,
                                         conf={"stateDir": str(self.state), **BEAT})

    def config(self, host: str, **options):
        return client_config(self.coordinator, service=self.hosts[host].tcp, **options)

    def services(self) -> dict[str, str]:
        with self.coordinator.connect() as conn:
            return {s["service_id"]: s["state"] for s in conn.call("list_services")}

    def wait_services(self, ready) -> dict[str, str]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            seen = self.services()
            if ready(seen):
                return seen
            time.sleep(0.2)
        raise AssertionError(f"the coordinator's registry never got there: {self.services()}")

    def stop(self) -> None:
        for svc in [*self.hosts.values(), self.coordinator]:
            svc.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def write_on_two_hosts(cluster: Cluster, name: str) -> pa.Table:
    """One write with a producer on each host (as two Spark tasks on two executors would), committed."""
    cfg = cluster.config("hostA", exchange=name, keys="id", numSubpartitions=3)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    done = []
    for index, host in enumerate(("hostA", "hostB")):
        on_host = dataclasses.replace(handle, config=handle.config.replace(service=cluster.hosts[host].tcp))
        task = ex.ProducerTask(on_host, index, f"{index}-0-{index}")
        task.write(table(index * 1000, 1000).to_batches(max_chunksize=256))
        done.append(task.finish())
    wh.commit_write(handle, [d["partition"] for d in done], {d["partition"]: d["rows"] for d in done})
    return pa.concat_tables([table(0, 1000), table(1000, 1000)])


def read_all(cluster: Cluster, name: str, host: str = "hostB", **options) -> pa.Table:
    settings = {"coordinator": cluster.coordinator.tcp, "service": cluster.hosts[host].tcp,
                "secret": cluster.coordinator.secret, **options}
    with client.open_reader(name, **settings) as reader:
        return reader.read_all().sort_by("id")


def test_services_register_and_a_stopped_one_is_lost_with_its_exchanges(cluster):
    expected = write_on_two_hosts(cluster, "held-on-two")
    with cluster.coordinator.connect() as conn:
        [desc] = [e for e in conn.call("list_exchanges") if e["name"] == "held-on-two"]
    # the coordinator knows which service holds each partition
    assert sorted(p["location"]["host_id"] for p in desc["producers"]) == ["hostA", "hostB"]
    assert read_all(cluster, "held-on-two").equals(expected)

    victim = cluster.hosts["hostA"]
    victim.stop(signal.SIGKILL)
    cluster.wait_services(lambda s: s[victim.info["service_id"]] == "lost")
    with pytest.raises(sfx.ExchangeLost, match="hostA") as info:
        read_all(cluster, "held-on-two")
    assert "heartbeat" in str(info.value) and victim.tcp in str(info.value)
    assert "held-on-two" not in [e.name for e in sfx.list_exchanges(**_options(cluster))]
    # the other host's service lives on, and said so
    assert cluster.services()[cluster.hosts["hostB"].info["service_id"]] == "alive"


def _options(cluster: Cluster) -> dict[str, str]:
    return _options_of(cluster.coordinator)


def _options_of(svc) -> dict[str, str]:
    return {"coordinator": svc.tcp, "secret": svc.secret}


def test_a_coordinator_killed_and_restarted_between_write_and_read_loses_nothing_committed(cluster):
    expected = write_on_two_hosts(cluster, "survives")
    ids = {h: cluster.hosts[h].info["service_id"] for h in cluster.hosts}
    [before] = [e for e in sfx.list_exchanges(**_options(cluster)) if e.name == "survives"]
    killed_at = time.time()
    cluster.restart_coordinator()
    # the services find the coordinator gone and register again with the new process
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        with cluster.coordinator.connect() as conn:
            registry = {s["service_id"]: s for s in conn.call("list_services")}
        if all(registry[i]["state"] == "alive" and registry[i]["registered"] > killed_at for i in ids.values()):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the services did not register again: {registry}")
    [desc] = [e for e in sfx.list_exchanges(**_options(cluster)) if e.name == "survives"]
    assert desc.state == "committed" and desc.rows == 2000 and desc.created == before.created
    assert read_all(cluster, "survives").equals(expected)
    assert read_all(cluster, "survives", host="hostA").equals(expected)
    # the state directory is private to the coordinator's user
    assert stat.S_IMODE(cluster.state.stat().st_mode) == 0o700
    files = [p for p in cluster.state.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    # a later drop is kept too: after another restart the exchange is gone
    sfx.drop_exchange("survives", **_options(cluster))
    cluster.restart_coordinator()
    assert "survives" not in [e.name for e in sfx.list_exchanges(**_options(cluster))]


def test_a_write_open_when_the_coordinator_restarts_is_aborted_saying_why(cluster):
    cfg = cluster.config("hostA", exchange="interrupted", keys="id", numSubpartitions=2)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "0-0-0")
    task.write(table(0, 100).to_batches())
    task.finish()
    cluster.restart_coordinator()
    with pytest.raises(sfx.ExchangeError, match="coordinator restarted while this write was open"):
        read_all(cluster, "interrupted", declareTimeout="0")
    with pytest.raises(sfx.ExchangeError, match="not open"):
        wh.commit_write(handle, [task.partition])
    # the restarted coordinator never knew the partition: the service frees it when it registers again
    deadline = time.monotonic() + WAIT
    while cluster.hosts["hostA"].status()["partitions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.hosts["hostA"].status()["partitions"] == []


def test_clients_wait_for_a_restarting_coordinator_within_a_bound(cluster):
    write_on_two_hosts(cluster, "waited-for")
    cluster.coordinator.stop(signal.SIGKILL)
    # nothing answers: a bounded retry, then an error naming the coordinator and the setting
    with pytest.raises(sfx.ServiceUnavailable, match=r"coordinator\.retryTimeout") as info:
        sfx.list_exchanges(**_options(cluster), **{"coordinator.retryTimeout": "1"})
    assert cluster.coordinator.tcp in str(info.value)
    # back within the bound: the call that was waiting gets its answer
    restart = threading.Timer(1.0, lambda: setattr(cluster, "coordinator", start_service(
        cluster.tmp / "coordinator", host_id="coordhost", port=cluster.port,
        conf={"stateDir": str(cluster.state), **BEAT})))
    restart.start()
    try:
        names = [e.name for e in sfx.list_exchanges(**_options(cluster), **{"coordinator.retryTimeout": "120"})]
    finally:
        restart.join()
    assert "waited-for" in names


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_cli_and_the_helpers_use_the_configured_coordinator_and_start_no_service(cluster, tmp_path):
    write_on_two_hosts(cluster, "seen-by-cli")
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    secret_file = tmp_path / "coordinator" / "secret"
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.sparkflow.exchange.coordinator {cluster.coordinator.tcp}\n"
        f"spark.sparkflow.exchange.secretFile {secret_file}\n")
    runtime = tmp_path / "empty-runtime"
    env = {**os.environ, "SPARK_CONF_DIR": str(conf_dir), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime)}

    status = _cli(["status"], env)
    assert status.returncode == 0, status.stderr
    assert "services by host (3 on 3 hosts" in status.stdout, status.stdout
    for host in ("hostA", "hostB", "coordhost"):
        assert f"\n  {host}\n" in status.stdout, status.stdout
    statuses = json.loads(_cli(["status", "--json"], env).stdout)
    [registry] = [s["services"] for s in statuses if s["services"]]
    assert {s["host_id"]: s["state"] for s in registry} == {"hostA": "alive", "hostB": "alive", "coordhost": "alive"}

    listed = _cli(["list", "--json"], env)
    assert [e["name"] for e in json.loads(listed.stdout)] == ["seen-by-cli"], listed.stderr
    dropped = _cli(["drop", "seen-by-cli"], env)
    assert dropped.returncode == 0 and "dropped seen-by-cli (2 partitions released)" in dropped.stdout, dropped.stderr
    assert json.loads(_cli(["list", "--json"], env).stdout) == []
    # nothing was started to answer: the runtime directory names no service
    assert sorted(p.name for p in runtime.iterdir()) == [] if runtime.exists() else True
    # the partitions were released on the services that held them
    for svc in cluster.hosts.values():
        assert svc.status()["partitions"] == []


HOST_APP = r'''
import json, os, sys
import sparkflow_exchange
from pyspark.sql import SparkSession, functions as F
from sparkflow_exchange.service.discovery import runtime_dir
jar = sys.argv[1]
spark = (SparkSession.builder.master("local[2]").appName("attaches-to-host-service")
         .config("spark.jars", jar).config("spark.plugins", "org.sparkflow.exchange.ExchangePlugin")
         .config("spark.pyspark.python", sys.executable).config("spark.ui.enabled", "false").getOrCreate())
df = spark.range(0, 1000, 1, 2).withColumn("v", F.concat(F.lit("row-"), F.col("id").cast("string")))
df.write.format("pipelined").mode("overwrite").option("exchange", "from-app").option("keys", "id") \
    .option("numSubpartitions", "2").save()
listed = [e.name for e in sparkflow_exchange.list_exchanges(spark)]
files = sorted(p.name for p in runtime_dir().iterdir())
spark.stop()
print(json.dumps({"listed": listed, "files": files}))
'''


@pytest.mark.spark
def test_the_plugin_attaches_to_its_hosts_running_service(cluster, tmp_path, jar):
    """Configured only by spark-defaults.conf (coordinator, secretFile): the application starts no service;
    its writers put their partitions in the host's `serve --no-coordinator`, which outlives the application."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    host = start_service(tmp_path / "app-host", host_id="apphost", coordinator=False,
                         conf={"coordinator": cluster.coordinator.tcp, **BEAT},
                         env={"SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime)})
    try:
        secret_file = tmp_path / "coordinator" / "secret"
        defaults = (f"spark.sparkflow.exchange.coordinator {cluster.coordinator.tcp}\n"
                    f"spark.sparkflow.exchange.secretFile {secret_file}\n")
        from conftest import run_app_with_jar

        result, proc = run_app_with_jar(tmp_path, HOST_APP, jar, defaults)
        assert result["listed"] == ["from-app"], result
        # no coordinator, host service or embedded service of the application's own: only the host's service
        # (serve-<pid>.json) and the executor's note pointing at it (jvm-<pid>.json)
        assert [f for f in result["files"] if not f.startswith(("serve-", "jvm-"))] == [], result
        assert "sparkflow-exchange" not in proc.stderr, proc.stderr[-5000:]
        [desc] = [e for e in ex.list_exchanges(client_config(cluster.coordinator)) if e["name"] == "from-app"]
        assert {p["location"]["service_id"] for p in desc["producers"]} == {host.info["service_id"]}
        assert len(desc["committed"]) == 2
        # the application has ended; its exchange is read from the host's service
        got = read_all(cluster, "from-app")
        assert got.select(["id", "v"]).cast(SCHEMA).equals(table(0, 1000))
    finally:
        host.stop()


def test_a_client_without_the_plugin_writes_to_its_hosts_service(cluster, tmp_path, monkeypatch):
    """Only the coordinator is configured: the writer finds the service `serve --no-coordinator` runs on its
    host for that coordinator (its runtime directory) and puts its partition there."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    host = start_service(tmp_path / "this-host", host_id="thishost", coordinator=False,
                         conf={"coordinator": cluster.coordinator.tcp, **BEAT},
                         env={"SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime)})
    try:
        monkeypatch.setenv("SPARKFLOW_EXCHANGE_RUNTIME_DIR", str(runtime))
        with client.open_writer("written-here", SCHEMA, keys=["id"], num_subpartitions=2, **_options(cluster)) as w:
            w.write(table(0, 500))
        [desc] = [e for e in ex.list_exchanges(client_config(cluster.coordinator)) if e["name"] == "written-here"]
        assert [p["location"]["service_id"] for p in desc["producers"]] == [host.info["service_id"]]
        with client.open_reader("written-here", **_options(cluster)) as reader:
            assert reader.read_all().sort_by("id").equals(table(0, 500))
        # `status` on this host, with no spark-defaults.conf: this host's service and the registry of the
        # coordinator it reports to
        conf_dir = tmp_path / "no-spark-conf"
        conf_dir.mkdir()
        status = _cli(["status"], {**os.environ, "SPARK_CONF_DIR": str(conf_dir)})
        assert status.returncode == 0, status.stderr
        assert f"holds partitions for the coordinator at {cluster.coordinator.tcp}" in status.stdout, status.stdout
        assert "(cluster coordinator) on coordhost" in status.stdout, status.stdout
        assert "services by host (4 on 4 hosts" in status.stdout, status.stdout
    finally:
        host.stop()


def test_a_state_directory_that_refuses_a_write_fails_the_request_naming_it(tmp_path):
    """The coordinator may write files of 4 KiB only (as a full disk would refuse more): a commit whose record
    is larger fails with a StorageError naming the state directory; smaller requests are still served."""
    state = tmp_path / "state"
    coordinator = start_service(tmp_path / "coordinator", conf={"stateDir": str(state)}, fsize=4096)
    try:
        cfg = client_config(coordinator, exchange="too-big-to-keep", keys="id", numSubpartitions=2)
        handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
        parts = []
        location = call(cfg, "ping")  # the coordinator's own service (registered): the only one here
        holder = coordinator.connect()  # the partitions a producer names are held by its service
        for index in range(40):  # 40 producers: a record of some 10 KiB
            part = f"too-big-to-keep.{index}"
            holder.send(RegisterPartition(part, 2, "HYBRID", exchange=handle.name, attempt="0"))
            while not isinstance(holder.recv(10), PartitionRegistered):  # its credit may come first
                pass
            call(cfg, "register_producer", name=handle.name, epoch=handle.epoch, write_id=handle.write_id,
                     index=index, attempt="0", partition=part, location=location)
            parts.append(part)
        with pytest.raises(sfx.StorageError, match="stateDir") as info:
            wh.commit_write(handle, parts)
        assert str(state) in str(info.value)
        assert [e.name for e in sfx.list_exchanges(**_options_of(coordinator))] == ["too-big-to-keep"]
        holder.close()
    finally:
        coordinator.stop()


def test_a_service_is_registered_before_it_announces_its_address(tmp_path):
    """A writer may come the moment a service's address is out (the plugin hands it to executors at once), and
    the coordinator accepts producers only of registered services: so a service reporting to a coordinator
    registers first. With a slow heartbeat, only that first registration can explain what we see."""
    coordinator = start_service(tmp_path / "coordinator", host_id="coordhost")
    host = None
    try:
        host = start_service(tmp_path / "hostA", host_id="hostA", coordinator=False,
                             conf={"coordinator": coordinator.tcp, "heartbeatInterval": "60",
                                   "heartbeatTimeout": "120"})
        with coordinator.connect() as conn:
            assert host.info["service_id"] in {s["service_id"] for s in conn.call("list_services")}
        cfg = client_config(coordinator, service=host.tcp, exchange="at-once", keys="id", numSubpartitions=2)
        handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
        task = ex.ProducerTask(handle, 0, "0-0-0")
        task.write(table(0, 10).to_batches())
        wh.commit_write(handle, [task.finish()["partition"]])
        [desc] = [e for e in ex.list_exchanges(client_config(coordinator)) if e["name"] == "at-once"]
        assert [p["location"]["service_id"] for p in desc["producers"]] == [host.info["service_id"]]
    finally:
        if host is not None:
            host.stop()
        coordinator.stop()


def test_a_drop_releases_partitions_at_each_registered_service(cluster):
    """The coordinator releases remote partitions at the address each service registered, proving the operator
    secret only to the service the producer's location names: both hosts' services free theirs."""
    write_on_two_hosts(cluster, "dropped-on-two")
    assert all(h.status()["partitions"] for h in cluster.hosts.values())
    sfx.drop_exchange("dropped-on-two", **_options(cluster))
    deadline = time.monotonic() + WAIT
    while any(h.status()["partitions"] for h in cluster.hosts.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [h.status()["partitions"] for h in cluster.hosts.values()] == [[], []]


def test_an_overwrite_open_when_the_coordinator_restarts_leaves_the_committed_version(cluster):
    """The version an open overwrite replaces is kept in the state directory with it: the restart aborts the
    overwrite, and the name reads the committed version again, every row."""
    expected = write_on_two_hosts(cluster, "kept-over-restart")
    cfg = cluster.config("hostA", exchange="kept-over-restart", keys="id", numSubpartitions=3)
    before = ex.describe_exchange(cfg)
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "0-0-0")
    task.write(table(10_000, 50).to_batches())
    task.finish()
    cluster.restart_coordinator()
    after = ex.describe_exchange(cfg)
    assert (after.epoch, after.state, after.rows) == (before.epoch, "committed", before.rows)
    assert read_all(cluster, "kept-over-restart").equals(expected)
