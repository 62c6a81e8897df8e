"""A training loop fed by a Spark job: the first batch reaches the loop while the job still writes, and a
state taken in an epoch read while the write ran is refused rather than resumed inexactly."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0 (scripts/setup.sh)")

import sparkflow_exchange as sfe  # noqa: E402
from sparkflow_exchange import ConfigError, ExchangeState  # noqa: E402

ROWS = 20_000
WAIT = 600  # bounds for a loaded machine, not expectations


def _held_task(marker: str):
    """mapInArrow function: Spark's partition 1 yields nothing until ``marker`` exists (bounded)."""
    def run(batches):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            deadline = time.monotonic() + WAIT
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield from batches
    return run


@pytest.mark.spark
def test_the_first_batch_reaches_the_loop_before_the_spark_job_writing_it_ends(spark, tmp_path):
    from sparkflow_exchange.torch import ExchangeDataset

    name = "torch-from-spark"
    marker = tmp_path / "go-on"
    df = spark.range(0, ROWS, 1, 2).mapInArrow(_held_task(str(marker)), "id long")
    failures: list[BaseException] = []

    def write() -> None:  # a Python thread of its own needs the session made active in it
        try:
            spark._jvm.org.apache.spark.sql.classic.SparkSession.setActiveSession(spark._jsparkSession)
            (df.write.format("pipelined").mode("overwrite").option("exchange", name).option("keys", "id")
               .option("numSubpartitions", "4").option("bufferTimeout", "20ms").save())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    job = threading.Thread(target=write, daemon=True)
    job.start()
    try:
        deadline = time.monotonic() + WAIT
        while name not in {e.name for e in sfe.list_exchanges()}:  # the job's planning declares it
            assert not failures, failures
            assert time.monotonic() < deadline, "the Spark job never declared the exchange"
            time.sleep(0.2)
        loader = ExchangeDataset(name, 256, balance="pad", shuffle=False).loader()
        batches = iter(loader)
        first = next(batches)
        # the job cannot have ended: its second task has not yielded a row yet
        assert job.is_alive() and not marker.exists()
        [summary] = [e for e in sfe.list_exchanges() if e.name == name]
        assert summary.state == ExchangeState.OPEN
        marker.write_text("go on")
        ids = [first["id"].numpy()] + [b["id"].numpy() for b in batches]
    finally:
        marker.write_text("go on")
        job.join(WAIT)
    assert not failures, failures
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(ROWS))
    sfe.drop_exchange(name)


def test_a_state_taken_mid_epoch_while_the_exchange_was_written_is_refused(tmp_service):
    """A ``pad`` epoch that began before the commit reads in arrival order, which no later read repeats: a
    resume from its middle is refused by name (a resume from an epoch's start, or a later epoch's, works)."""
    from sparkflow_exchange.torch import ExchangeDataset

    svc = tmp_service()
    settings = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    writer = sfe.open_writer("torch-live", schema, keys=["id"], num_subpartitions=2, bufferSize="4k",
                             bufferTimeout="20ms", **settings)
    try:
        writer.write(pa.record_batch([pa.array(np.arange(5_000))], schema=schema))
        ds = ExchangeDataset("torch-live", 100, balance="pad", shuffle=False, **settings)
        loader = ds.loader()
        batches = iter(loader)
        seen = [next(batches)["id"].numpy() for _ in range(3)]
        state = loader.state_dict()
        assert state["live"] and state["steps"] == 3
        writer.write(pa.record_batch([pa.array(np.arange(5_000, 8_000))], schema=schema))
        writer.commit()
        seen += [b["id"].numpy() for b in batches]
    finally:
        writer.abort("test ended")
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(8_000))
    again = ExchangeDataset("torch-live", 100, balance="pad", shuffle=False, **settings)
    with pytest.raises(ConfigError, match=r"step 3 of epoch 0, which began while exchange 'torch-live' was still "
                                          r"written .* arrival order"):
        again.load_state_dict(state)
    again.load_state_dict({**state, "steps": 0})  # from the epoch's start: every row once
    assert np.array_equal(np.sort(np.concatenate([b["id"].numpy() for b in again.loader()])), np.arange(8_000))
    after = loader.state_dict()  # the loader ran epoch 0 to its end: the next epoch begins after the commit
    assert (after["epoch"], after["steps"], after["live"]) == (1, 0, False)
