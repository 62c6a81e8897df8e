"""Streams without Spark, against a real service: epochs as micro-batches are written, replayed, read by
consumer groups, released once every group is past them, and a writer waits while the stream retains
more than stream.maxRetainedBytes."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from harness import client_config

import sparkflow_exchange
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.buffer_kinds import epoch_marker
from sparkflow_exchange.calls import call
from sparkflow_exchange.errors import ExchangeError, ExchangeLost, ExchangeReadError, ServiceError
from sparkflow_exchange.spark import streaming as st

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
QUERY = "writer-query-1"


def write_epoch(handle: st.StreamHandle, epoch: int, ids: np.ndarray, producers: int = 2,
                commit: bool = True) -> list[str]:
    """One micro-batch: ``producers`` tasks split ``ids`` (each begins the epoch, as Spark's tasks do), then
    (optionally) Spark's commit."""
    done, rows = [], {}
    for p, part in enumerate(np.array_split(ids, producers)):
        wh = st.begin_epoch(handle, epoch, QUERY)
        if wh is None:
            return []
        task = ex.ProducerTask(wh, p, f"{epoch}-{p}")
        task.write([pa.record_batch([pa.array(part, pa.int64())], schema=SCHEMA)])
        result = task.finish(epoch_marker(epoch))
        done.append(result["partition"])
        rows[result["partition"]] = result["rows"]
    if commit:
        st.commit_epoch(handle, epoch, done, rows)
    return done


def read_to(config, group: str, after: int, upto: int | None = None) -> tuple[int, list[int]]:
    """One reader micro-batch: the newest epoch it may read, then every subpartition of (after, end]."""
    end = st.latest_epoch(config, group, after, upto=upto)["epoch"]
    plan = st.plan_epochs(config, after, end)
    ids = [i for sub in range(plan["num_subpartitions"] or 0)
           for b in st.read_epochs(config, SCHEMA, plan["epochs"], sub) for i in b.column("id").to_pylist()]
    return end, ids


def status(svc) -> dict:
    return call(client_config(svc), "status")


def stream_of(svc, name: str) -> dict:
    return [e for e in status(svc)["exchanges"] if e["name"] == name][0]


@pytest.fixture
def stream(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="events", partitioner="hash", keys="id",
                           numSubpartitions="3", declareTimeout="0.5s")
    return svc, config, st.declare_stream(config, SCHEMA)


def test_epochs_are_read_in_order_exactly_once_and_a_replay_is_skipped(stream):
    svc, config, handle = stream
    for epoch in range(3):
        write_epoch(handle, epoch, np.arange(epoch * 100, epoch * 100 + 100))
    assert write_epoch(handle, 2, np.arange(10_000, 10_100)) == []  # a replay of a committed batch writes nothing
    st.commit_epoch(handle, 2, [], {})  # and its commit changes nothing
    group = st.join_group(config)
    assert group["position"] == -1  # earliest: every retained epoch
    end, ids = read_to(config, group["group"], -1)
    assert end == 2
    assert sorted(ids) == list(range(300))
    st.commit_group(config, group["group"], end)
    write_epoch(handle, 3, np.arange(300, 350))
    end, ids = read_to(config, group["group"], 2)
    assert (end, sorted(ids)) == (3, list(range(300, 350)))


def test_an_uncommitted_epoch_is_replaced_by_the_replay_of_a_restarted_query(stream):
    svc, config, handle = stream
    write_epoch(handle, 0, np.arange(100), commit=False)  # the query died before Spark's commit
    restarted = st.declare_stream(config, SCHEMA)  # the query starts again: a later run
    partitions = write_epoch(restarted, 0, np.arange(1000, 1100), commit=False)
    # a task of the stopped run that starts late cannot take the epoch back
    with pytest.raises(ExchangeError, match="belongs to a later start of the writer query"):
        write_epoch(handle, 0, np.arange(5))
    st.commit_epoch(restarted, 0, partitions, {p: 50 for p in partitions})
    group = st.join_group(config)["group"]
    end, ids = read_to(config, group, -1)
    assert end == 0 and sorted(ids) == list(range(1000, 1100))
    parts = [p["partition"] for p in status(svc)["partitions"]]
    assert len(parts) == 2, parts  # the first run's partitions were released with the replay


def test_epochs_are_released_once_every_group_is_past_them_and_spill_files_go(stream):
    svc, config, handle = stream
    spill_dir = status(svc)["service"]["spill_dir"]
    baseline = (len(status(svc)["partitions"]), len(os.listdir(spill_dir)))
    a = st.join_group(config.replace(consumer_group="a"))["group"]
    b = st.join_group(config.replace(consumer_group="b"))["group"]
    for epoch in range(4):
        write_epoch(handle, epoch, np.arange(epoch * 10, epoch * 10 + 10))
    assert stream_of(svc, "events")["retained_epochs"] == 4
    end_a, ids_a = read_to(config, a, -1)
    st.commit_group(config, a, end_a)
    assert stream_of(svc, "events")["retained_epochs"] == 4  # b has read nothing yet
    end_b, ids_b = read_to(config, b, -1, upto=1)
    st.commit_group(config, b, end_b)
    assert stream_of(svc, "events")["released_upto"] == 1 and stream_of(svc, "events")["retained_epochs"] == 2
    end_b, more_b = read_to(config, b, 1)
    st.commit_group(config, b, end_b)
    assert sorted(ids_a) == sorted(ids_b + more_b) == list(range(40))
    deadline = time.monotonic() + 10
    while (len(status(svc)["partitions"]), len(os.listdir(spill_dir))) != baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (len(status(svc)["partitions"]), len(os.listdir(spill_dir))) == baseline
    assert stream_of(svc, "events")["retained_bytes"] == 0


def test_a_reader_behind_released_epochs_gets_a_loss_error_not_fewer_rows(stream):
    svc, config, handle = stream
    st.join_group(config.replace(consumer_group="fast"))
    for epoch in range(3):
        write_epoch(handle, epoch, np.arange(epoch * 10, epoch * 10 + 10))
    st.commit_group(config, "fast", 2)
    with pytest.raises(ExchangeLost, match=r"epochs 0\.\.2 were released"):
        st.latest_epoch(config, "restored-from-an-old-checkpoint", -1)


def test_admission_control_reads_whole_epochs_within_the_limits(stream):
    svc, config, handle = stream
    for epoch in range(5):
        write_epoch(handle, epoch, np.arange(epoch * 100, epoch * 100 + 100))
    group = st.join_group(config)["group"]
    assert st.latest_epoch(config.replace(max_epochs_per_trigger=2), group, -1)["epoch"] == 1
    assert st.latest_epoch(config, group, -1, max_rows=250)["epoch"] == 1
    assert st.latest_epoch(config, group, -1, max_rows=10)["epoch"] == 0  # at least one epoch
    assert st.latest_epoch(config, group, -1)["epoch"] == 4
    assert st.latest_epoch(config, group, 2, upto=3)["epoch"] == 3  # availableNow's bound: nothing newer
    # asking from epoch 2 means Spark finished the batch that ended there: the group is done with 0..2
    assert stream_of(svc, "events")["released_upto"] == 2
    with pytest.raises(ExchangeLost, match=r"epochs 0\.\.2 were released"):
        st.latest_epoch(config, group, -1)


def test_writer_waits_while_the_stream_retains_too_much_and_goes_on_when_a_reader_commits(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="bounded", partitioner="hash", keys="id",
                           numSubpartitions="2", **{"stream.maxRetainedBytes": "1k"}, readerTimeout="30s")
    handle = st.declare_stream(config, SCHEMA)
    group = st.join_group(config)["group"]
    write_epoch(handle, 0, np.arange(1000))  # 8 KB: over the bound from now on
    started = threading.Event()
    finished = []

    def writer():
        started.set()
        write_epoch(handle, 1, np.arange(1000, 2000))
        finished.append(time.monotonic())

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    started.wait()
    time.sleep(1.5)
    assert not finished  # blocked: epoch 0 is not read yet
    assert stream_of(svc, "bounded")["writer_waiting_s"] > 0.5
    end, ids = read_to(config, group, -1)
    reader_done = time.monotonic()
    st.commit_group(config, group, end)
    t.join(20)
    assert finished and finished[0] >= reader_done
    end, more = read_to(config, group, 0)
    assert sorted(ids + more) == list(range(2000))


def test_writer_waiting_on_a_reader_gone_for_good_fails_with_a_clear_error(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="stuck", partitioner="hash", keys="id",
                           numSubpartitions="2", **{"stream.maxRetainedBytes": "1k"}, readerTimeout="1.5s")
    handle = st.declare_stream(config, SCHEMA)
    st.join_group(config.replace(consumer_group="gone"))
    alive = st.join_group(config.replace(consumer_group="alive"))["group"]
    write_epoch(handle, 0, np.arange(1000))
    end, ids = read_to(config, alive, -1)
    st.commit_group(config, alive, end)
    t0 = time.monotonic()
    with pytest.raises(ExchangeError, match=r"waited 1.5 s .*stream.maxRetainedBytes=1024.*gone at epoch -1"):
        write_epoch(handle, 1, np.arange(10))
    assert time.monotonic() - t0 < 15
    # the operator forgets the group that is gone: the epoch it held is released, the writer goes on
    assert sparkflow_exchange.leave_group("stuck", "gone", **config.to_keys()) == {"left": True}
    write_epoch(handle, 1, np.arange(1000, 1010))
    end, more = read_to(config, alive, 0)
    assert sorted(ids + more) == list(range(1000)) + list(range(1000, 1010))


def test_bad_uses_of_a_stream_get_clear_errors(stream, tmp_service):
    svc, config, handle = stream
    write_epoch(handle, 0, np.arange(10))
    with pytest.raises(ExchangeError, match="is a stream written by a streaming query: read it with spark.readStream"):
        ex.describe_exchange(config)
    with pytest.raises(ExchangeError, match="is a stream written by a streaming query; a batch write cannot"):
        ex.declare_write(config, SCHEMA, overwrite=True)
    with pytest.raises(ExchangeError, match="written by streaming query writer-query-1; query other cannot"):
        st.begin_epoch(handle, 1, "other")
    with pytest.raises(ExchangeError, match="re-readable partitionType"):
        st.declare_stream(config.replace(exchange="bounded-pipe", partition_type="PIPELINED_BOUNDED"), SCHEMA)
    with pytest.raises(ExchangeError, match="another schema"):
        st.declare_stream(config, pa.schema([pa.field("id", pa.string())]))
    ex.declare_write(config.replace(exchange="batch-one"), SCHEMA, overwrite=True)
    with pytest.raises(ExchangeError, match="written by a batch job, not a streaming query"):
        st.describe_stream(config.replace(exchange="batch-one"))
    assert ex.describe_exchange(config, allow_stream=True).kind == "stream"
    assert ex.drop_exchange("events", config)["dropped"] == "events"
    with pytest.raises(ExchangeError, match="stream 'events' does not exist"):
        st.describe_stream(config)


def test_operator_sees_a_stream_its_groups_and_a_waiting_writer_and_can_drop_it(tmp_service):
    from test_cli import _cli

    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="ops", partitioner="hash", keys="id", numSubpartitions="2",
                           **{"stream.maxRetainedBytes": "1k"}, readerTimeout="30s")
    handle = st.declare_stream(config, SCHEMA)
    st.join_group(config.replace(consumer_group="dashboard"))
    write_epoch(handle, 0, np.arange(1000))
    outcome = []

    def write_blocked():
        try:
            write_epoch(handle, 1, np.arange(5))
            outcome.append("written")
        except ExchangeError as exc:
            outcome.append(str(exc))

    blocked = threading.Thread(target=write_blocked, daemon=True)
    blocked.start()
    base = ["--address", svc.tcp, "--secret-file", str(svc.home / "secret")]
    deadline = time.monotonic() + 120  # the writer thread is waiting once status says so (a loaded machine is slow)
    while True:
        human = _cli("status", *base)
        assert human.returncode == 0, human.stderr
        line = [ln for ln in human.stdout.splitlines() if ln.strip().startswith("ops ")][0]
        if "writer waiting" in line or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "epochs<=0 retained=1" in line and "groups: dashboard@-1" in line and "writer waiting" in line
    dropped = _cli("drop", "ops", *base)
    assert dropped.returncode == 0 and "dropped stream ops (1 retained epochs released)" in dropped.stdout
    blocked.join(20)  # the waiting writer goes on (into an error: its stream is gone) instead of hanging
    assert not blocked.is_alive()
    assert outcome and "stream 'ops' was dropped while micro-batch 1 waited" in outcome[0]
    assert svc.status()["partitions"] == []


def test_a_group_that_never_planned_a_batch_is_forgotten_and_holds_nothing(tmp_service):
    # a reader query stopped before its first batch has no offsets in its checkpoint: restarted, it joins as a
    # new group, and the first one must not hold the stream's epochs back for ttl
    svc = tmp_service(host_id="hostA", conf={"declareTimeout": "1s"})
    config = client_config(svc, hostId="hostA", exchange="phantom", partitioner="hash", keys="id",
                           numSubpartitions="2")
    handle = st.declare_stream(config, SCHEMA)
    phantom = st.join_group(config)["group"]
    st.latest_epoch(config, phantom, -1)  # polled while nothing was committed: no batch planned
    real = st.join_group(config)["group"]
    write_epoch(handle, 0, np.arange(10))
    end, ids = read_to(config, real, -1)
    st.commit_group(config, real, end)
    assert stream_of(svc, "phantom")["retained_epochs"] == 1  # held by the phantom for now
    deadline = time.monotonic() + 15
    while stream_of(svc, "phantom")["retained_epochs"] and time.monotonic() < deadline:
        time.sleep(0.2)
    info = stream_of(svc, "phantom")
    assert list(info["groups"]) == [real] and info["groups"][real]["confirmed"]
    assert info["retained_epochs"] == 0 and sorted(ids) == list(range(10))


def test_groups_named_by_the_writer_get_every_epoch_however_late_they_start(tmp_service):
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="known", partitioner="hash", keys="id", numSubpartitions="2")
    handle = st.declare_stream(config.replace(stream_consumer_groups=("early", "late")), SCHEMA)
    early = st.join_group(config.replace(consumer_group="early"))["group"]
    walk_in = st.join_group(config.replace(consumer_group="walk-in"))["group"]
    for epoch in range(3):
        write_epoch(handle, epoch, np.arange(epoch * 10, epoch * 10 + 10))
    for group in (early, walk_in):
        end, ids = read_to(config, group, -1)
        st.commit_group(config, group, end)
    assert stream_of(svc, "known")["retained_epochs"] == 3  # "late" has read nothing yet
    late = st.join_group(config.replace(consumer_group="late"))
    assert late["position"] == -1
    end, ids = read_to(config, "late", -1)
    assert sorted(ids) == list(range(30))
    st.commit_group(config, "late", end)
    assert stream_of(svc, "known")["retained_epochs"] == 0


@pytest.mark.parametrize("partition_type, host", [("HYBRID", "hostA"), ("BLOCKING", "hostA"), ("HYBRID", "elsewhere")])
def test_every_channel_must_end_its_epoch_with_that_epochs_marker(tmp_service, partition_type, host):
    """Flink's barrier: an epoch is whole when each producer's subpartition delivered the epoch's marker, then
    its end of partition; a partition that is not that epoch (no marker, another epoch's) fails the read."""
    svc = tmp_service(host_id="hostA")
    config = client_config(svc, hostId="hostA", exchange="marked", partitioner="hash", keys="id",
                           numSubpartitions="2", partitionType=partition_type)
    handle = st.declare_stream(config, SCHEMA)
    write_epoch(handle, 0, np.arange(100))
    write_epoch(handle, 1, np.arange(100, 200))
    reader = config.replace(host_id=host)  # another host: socket channels; this host: the spill files
    plans = st.plan_epochs(reader, -1, 1)["epochs"]
    ids = sorted(i for sub in range(2) for b in st.read_epochs(reader, SCHEMA, plans, sub)
                 for i in b.column("id").to_pylist())
    assert ids == list(range(200))
    swapped = [{**plans[0], "epoch": 1}]  # epoch 0's partitions offered as epoch 1
    with pytest.raises(ExchangeReadError, match=r"lost data .*epoch markers \[0\], not the one marker of epoch 1"):
        list(st.read_epochs(reader, SCHEMA, swapped, 0))
    unmarked = st.declare_stream(config.replace(exchange="unmarked"), SCHEMA)
    wh = st.begin_epoch(unmarked, 0, QUERY)
    task = ex.ProducerTask(wh, 0, "a0")
    task.write([pa.record_batch([pa.array(np.arange(10), pa.int64())], schema=SCHEMA)])
    done = task.finish()  # no marker: not a stream's epoch
    st.commit_epoch(unmarked, 0, [done["partition"]], {done["partition"]: 10})
    plans = st.plan_epochs(reader.replace(exchange="unmarked"), -1, 0)["epochs"]
    with pytest.raises(ExchangeReadError, match=r"epoch markers \[\], not the one marker of epoch 0"):
        list(st.read_epochs(reader, SCHEMA, plans, 0))


def test_an_idle_reader_waits_for_the_next_commit_and_gets_it_at_once(stream):
    """stream.pollWait: latest waits on the service for the writer's commit (a long poll), returns as soon
    as it lands; without one it returns after the wait; availableNow's bound never waits."""
    svc, config, handle = stream
    group = st.join_group(config)["group"]
    t0 = time.monotonic()
    assert st.latest_epoch(config, group, -1, wait=0.6)["epoch"] == -1  # nothing came: the wait runs out
    assert 0.5 <= time.monotonic() - t0 < 5
    committed = []

    def writer():
        time.sleep(0.4)
        write_epoch(handle, 0, np.arange(10))
        committed.append(time.monotonic())

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    found = st.latest_epoch(config, group, -1, wait=20)
    answered = time.monotonic()
    t.join(20)
    assert found == {"epoch": 0, "last_committed": 0}
    assert committed and answered - committed[0] < 1.0  # woken by the commit, not by the 20 s wait
    t0 = time.monotonic()
    assert st.latest_epoch(config, group, 0, upto=0, wait=20)["epoch"] == 0  # availableNow: nothing more to wait for
    assert st.latest_epoch(config, group, 0, wait=0)["epoch"] == 0
    assert time.monotonic() - t0 < 5


def test_a_stream_unused_for_ttl_is_dropped_and_one_in_use_is_kept(tmp_service):
    """A stream expires as an exchange does: once neither its writer query nor a reader used it for ``ttl``, it
    and its epochs go (their partitions freed); while its writer keeps calling it stays."""
    svc = tmp_service(host_id="hostA", conf={"ttl": "2s"})
    config = client_config(svc, hostId="hostA", exchange="idle", partitioner="hash", keys="id",
                           numSubpartitions="2", declareTimeout="0.5s")
    write_epoch(st.declare_stream(config, SCHEMA), 0, np.arange(100))
    st.join_group(config, "gone")  # a reader query that stopped too
    busy = st.declare_stream(config.replace(exchange="busy"), SCHEMA)
    assert {e["name"] for e in status(svc)["exchanges"]} == {"idle", "busy"}
    assert len(status(svc)["partitions"]) == 2
    deadline = time.monotonic() + 30
    epoch = 0
    while time.monotonic() < deadline and "idle" in {e["name"] for e in status(svc)["exchanges"]}:
        write_epoch(busy, epoch, np.arange(10), producers=1)  # the busy stream's writer keeps writing
        epoch += 1
        time.sleep(0.3)
    names = {e["name"] for e in status(svc)["exchanges"]}
    assert names == {"busy"}, names
    assert all(p["exchange"].startswith("busy#") for p in status(svc)["partitions"])  # the idle one's were freed
    with pytest.raises(ServiceError, match="stream 'idle' does not exist"):
        st.join_group(config)


def test_the_python_sink_pushes_at_the_stream_buffer_timeout_unless_buffer_timeout_is_an_option(tmp_service):
    """A stream's write task pushes what it holds after stream.bufferTimeout (1 ms), not the batch writer's
    bufferTimeout (here 1 h, as a session could set it), while its input is still open: a Real-time Mode reader
    takes an epoch's rows as they are pushed. bufferTimeout given as the write's option wins, as in the JVM sink."""
    svc = tmp_service(host_id="hostA")
    batch_setting = client_config(svc, hostId="hostA", partitioner="hash", keys="id",
                                  numSubpartitions="2").replace(buffer_timeout=3600.0)

    def pushed_while_open(name: str, options: dict, wait: float) -> bool:
        config, task_options = st.live_flush(batch_setting.replace(exchange=name), options)
        handle = st.begin_epoch(st.declare_stream(config, SCHEMA), 0, QUERY)
        seen = []

        def rows_then_wait():
            yield pa.record_batch([pa.array(np.arange(100), pa.int64())], schema=SCHEMA)
            deadline = time.monotonic() + wait  # the task's input stays open meanwhile
            while not seen and time.monotonic() < deadline:
                if status(svc)["exchange_traffic"].get(f"{name}#0", {}).get("bytes_written"):
                    seen.append(True)
                time.sleep(0.01)
        task = ex.ProducerTask(handle, 0, "a0")
        task.write(rows_then_wait())
        task.finish(epoch_marker(0))
        return bool(seen), task_options

    live, options = pushed_while_open("live", {}, wait=30)
    assert live and options == {"bufferTimeout": "0.001"}
    held, options = pushed_while_open("held", {"BufferTimeout": "1h"}, wait=1)
    assert not held and options == {"BufferTimeout": "1h"}  # pushed at the task's end only
