"""Replicas in the coordinator, without sockets: where a partition's copies go, when a replicated write may
commit, and what a lost service means for an exchange whose partitions have copies (its lifecycle's
``FAIL_OVER``: read on from the copies; ``LOSE`` when a partition has none left)."""
from __future__ import annotations

import asyncio

import pytest

from sparkflow_exchange.errors import ErrorCode, ServiceError
from sparkflow_exchange.kinds import ExchangeState as S
from sparkflow_exchange.service.coordinator import Coordinator
from sparkflow_exchange.service.exchange_lifecycle import Action, Kind, Lifecycle, ReplicaState, after_loss
from sparkflow_exchange.service.exchange_lifecycle import Event as E


# ------------------------------------------------------------------ the sans-IO part
def test_a_fail_over_keeps_the_exchange_committed_and_tells_readers():
    life = Lifecycle("x", Kind.BATCH)
    life.on(E.OPEN_WRITE, "w1")
    life.on(E.COMMIT, "w1")
    t = life.on(E.FAIL_OVER, reason="its service was lost")
    assert t.state is S.COMMITTED and life.sealed
    assert t.actions == (Action.PERSIST, Action.NOTIFY)


def test_after_a_loss_each_partition_needs_a_complete_copy_on_a_live_service():
    complete, writing, lost = ReplicaState.COMPLETE, ReplicaState.WRITING, ReplicaState.LOST
    ok = after_loss({"p0": [(lost, False), (complete, True)], "p1": [(complete, True)]})
    assert ok.event is E.FAIL_OVER and ok.moves == {"p0": 1, "p1": 0} and ok.missing == ()
    for replicas in ([], [(writing, True)], [(complete, False)], [(lost, True)]):
        verdict = after_loss({"p0": [(complete, True)], "p1": replicas})
        assert verdict.event is E.LOSE and verdict.missing == ("p1",), replicas


# ------------------------------------------------------------------ the coordinator
def _coordinator(hosts: list[str]) -> tuple[Coordinator, list]:
    released: list = []
    coord = Coordinator(lambda targets, reason="", code="": released.extend(targets))
    for i, host in enumerate(hosts):
        coord.services.register(f"s{i}", host, f"198.18.0.{i + 1}:7338", f"unix:/run/s{i}.sock", 100 + i)
    return coord, released


async def _written(coord: Coordinator, producers: int = 2, finished_replicas: bool = True) -> dict:
    d = await coord.declare("x", "schema", 4, {"name": "hash", "keys": ["k"]}, "HYBRID", "overwrite", replicas=1)
    placed = {}
    for i in range(producers):
        answer = await coord.register_producer("x", d["epoch"], d["write_id"], i, f"a{i}", f"p{i}",
                                               {"service_id": "s1"})
        placed[f"p{i}"] = answer["replicas"]
        done = [r["service_id"] for r in answer["replicas"]] if finished_replicas else []
        await coord.producer_finished("x", d["epoch"], f"p{i}", replicas=done)
    return {"declared": d, "placed": placed}


def test_replicas_go_to_services_of_other_hosts_spread_over_them():
    async def scenario() -> dict:
        coord, _ = _coordinator(["h0", "h1", "h2"])
        return await _written(coord, producers=4)

    placed = asyncio.run(scenario())["placed"]
    assert all(len(r) == 1 and r[0]["host_id"] != "h1" for r in placed.values()), placed
    # the registry's own addresses, and both other hosts used
    assert {r[0]["service_id"] for r in placed.values()} == {"s0", "s2"}
    assert all(r[0]["tcp"].startswith("198.18.0.") and r[0]["pid"] >= 100 for r in placed.values())


def test_replicas_on_a_cluster_of_one_host_are_refused_at_write_time_naming_why():
    async def scenario() -> None:
        coord, _ = _coordinator(["h0", "h0"])  # two services, one host: a copy there survives nothing
        await coord.declare("x", "schema", 4, {"name": "hash", "keys": ["k"]}, "HYBRID", "overwrite", replicas=1)

    with pytest.raises(ServiceError) as info:
        asyncio.run(scenario())
    assert info.value.code == ErrorCode.NO_REPLICA_HOST
    message = str(info.value)
    assert "replicas=1 needs live exchange services on 2 hosts" in message and "on 1 host (h0)" in message, message
    assert "replicas=0" in message and "\n" not in message


def test_a_replicated_write_commits_only_when_every_replica_is_complete():
    async def scenario() -> tuple[str, dict]:
        coord, _ = _coordinator(["h0", "h1", "h2"])
        w = await _written(coord, finished_replicas=False)
        d = w["declared"]
        with pytest.raises(ServiceError) as info:
            await coord.commit("x", d["epoch"], d["write_id"], ["p0", "p1"])
        return str(info.value), coord.exchanges["x"].describe()

    message, desc = asyncio.run(scenario())
    assert "has 0 of replicas=1 complete copies" in message and "writing" in message, message
    assert desc["state"] == "open" and desc["committed"] == []


def test_a_lost_service_fails_over_to_the_replicas_then_their_loss_loses_the_exchange():
    async def scenario() -> dict:
        coord, released = _coordinator(["h0", "h1", "h2"])
        w = await _written(coord)
        d = w["declared"]
        await coord.commit("x", d["epoch"], d["write_id"], ["p0", "p1"])
        seen: list[dict] = []
        coord.subscribe("x", seen.append)
        out = {"placed": w["placed"]}
        before = coord.exchanges["x"].describe()
        assert before["replication"] == {"partitions": 2, "replicated": 2, "under_replicated": 0, "failed_over": 0}
        lost = coord.services.services["s1"]
        lost.state, lost.lost_reason = "lost", "killed"
        await coord.services_lost([lost])
        out["after"] = coord.exchanges["x"].describe()
        out["told"] = [p["location"]["service_id"] for body in seen[1:] for p in body.get("producers", [])]
        out["get"] = await coord.get_exchange("x")
        # the replicas' services go too: nothing is left of the partitions
        for sid in {r[0]["service_id"] for r in w["placed"].values()}:
            record = coord.services.services[sid]
            record.state, record.lost_reason = "lost", "host down"
            await coord.services_lost([record])
        out["lost"] = "x" not in coord.exchanges and coord.lost.get("x", {}).get("message", "")
        out["released"] = released
        return out

    out = asyncio.run(scenario())
    after = out["after"]
    assert after["state"] == "committed" and after["readable"]["sealed"], after["readable"]
    for p in after["producers"]:
        replica = out["placed"][p["partition"]][0]
        assert p["location"]["service_id"] == replica["service_id"] and p["spill"] == "" and p["failed_over"] == 1
        assert [(r["location"]["service_id"], r["state"]) for r in p["replicas"]] == [("s1", "lost")]
    assert after["replication"] == {"partitions": 2, "replicated": 0, "under_replicated": 2, "failed_over": 2}
    assert sorted(out["told"]) == sorted(r[0]["service_id"] for r in out["placed"].values())  # readers were told
    assert out["get"]["producers"] == after["producers"]  # a reader started after the loss reads the replicas
    assert "was lost" in out["lost"] and "no complete replica" in out["lost"], out["lost"]


def test_a_dropped_replicated_exchange_releases_its_replicas_too():
    async def scenario() -> tuple[dict, list]:
        coord, released = _coordinator(["h0", "h1", "h2"])
        w = await _written(coord)
        d = w["declared"]
        await coord.commit("x", d["epoch"], d["write_id"], ["p0", "p1"])
        await coord.drop("x")
        return w["placed"], released

    placed, released = asyncio.run(scenario())
    where = sorted((loc["service_id"], pid) for loc, pid, _ in released)
    assert where == sorted([("s1", "p0"), ("s1", "p1")] + [(r[0]["service_id"], p) for p, r in placed.items()])


def test_replicas_of_a_partition_consumed_once_are_refused():
    from sparkflow_exchange.config import ConfigError, ExchangeConfig

    with pytest.raises(ConfigError, match="PIPELINED_BOUNDED partition is consumed once"):
        ExchangeConfig.load({"exchange": "x", "replicas": "1", "partitionType": "PIPELINED_BOUNDED"}, spark_conf={})
    with pytest.raises(ConfigError, match="replicas must be 0 to 3"):
        ExchangeConfig.load({"exchange": "x", "replicas": "4"}, spark_conf={})

    async def scenario() -> None:
        coord, _ = _coordinator(["h0", "h1"])
        await coord.declare("x", "schema", 4, {"name": "hash", "keys": ["k"]}, "PIPELINED_BOUNDED", "overwrite",
                            replicas=1)

    with pytest.raises(ServiceError, match="consumed once") as info:
        asyncio.run(scenario())
    assert info.value.code == ErrorCode.BAD_REQUEST


def test_a_restarted_coordinator_takes_up_the_replicas_from_its_record():
    from sparkflow_exchange.service.exchanges import Exchange

    async def scenario() -> Exchange:
        coord, _ = _coordinator(["h0", "h1", "h2"])
        w = await _written(coord)
        d = w["declared"]
        await coord.commit("x", d["epoch"], d["write_id"], ["p0", "p1"])
        return coord.exchanges["x"]

    ex = asyncio.run(scenario())
    again = Exchange.from_record(ex.record())
    assert again.replicas == 1 and again.describe()["replication"] == ex.describe()["replication"]
    assert [p.replicas for p in again.producers.values()] == [p.replicas for p in ex.producers.values()]
    assert all(p.replicas[0]["state"] == ReplicaState.COMPLETE for p in again.producers.values())
