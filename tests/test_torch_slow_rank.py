"""A slow rank of a training job holds back only the producers of its own subpartitions
(``PIPELINED_BOUNDED``) or no one (``HYBRID``), against a real service.

Two producers of one write, each writing only one subpartition (every row of producer *i* hashes to
subpartition *i*); two ranks of an ``ExchangeDataset``, rank *i* reading subpartition *i*. Rank 1 takes
one batch and then stops reading until the test lets it go on. The assertions are on counts of rows
written and read, with bounded waits, never on how long anything took.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0 (scripts/setup.sh)")

from harness import client_config  # noqa: E402

from sparkflow_exchange import exchange as ex  # noqa: E402
from sparkflow_exchange import write_handle as wh  # noqa: E402
from sparkflow_exchange.writer.spark_hash import spark_partition_ids  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("k", pa.int64(), nullable=False),
                    pa.field("x", pa.float32(), nullable=False)])
ROWS, CHUNK, BATCH = 150 * 4_096, 10_240, 4_096  # rows per producer (7 MB), rows per write call, rows per step
# small buffers and pools, so that a stalled subpartition fills its producer's pool after a few hundred KB
SMALL = {"bufferSize": "32k", "sortBufferSize": "256k", "buffersPerPartition": "8", "sharedMemory": "false",
         "bufferTimeout": "20ms", "pipelined.noConsumerTimeout": "900s", "readerTimeout": "900s"}
WAIT = 600  # bounds for a loaded machine, not expectations


def _key_of(sub: int) -> int:
    """A key value ``repartition(2, "k")`` places in subpartition ``sub``."""
    candidates = pa.table({"k": pa.array(np.arange(64), pa.int64())})
    return int(np.flatnonzero(np.asarray(spark_partition_ids(candidates, ["k"], 2)) == sub)[0])


class Producer(threading.Thread):
    """One producer of the write, counting the rows its write calls have taken."""

    def __init__(self, handle, index: int) -> None:
        super().__init__(daemon=True)
        self.task = ex.ProducerTask(handle, index, f"a{index}")
        self.index, self.key, self.written, self.partition, self.error = index, _key_of(index), 0, None, None

    def run(self) -> None:
        try:
            for start in range(0, ROWS, CHUNK):
                ids = np.arange(start, start + CHUNK, dtype=np.int64) + self.index * ROWS
                self.task.write([pa.record_batch([pa.array(ids), pa.array(np.full(CHUNK, self.key, np.int64)),
                                                  pa.array(ids.astype(np.float32))], schema=SCHEMA)])
                self.written += CHUNK
            self.partition = self.task.finish()["partition"]
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class Rank(threading.Thread):
    """One rank's reader; ``hold``: after its first batch it reads on only once the event is set."""

    def __init__(self, rank: int, settings: dict, hold: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        from sparkflow_exchange.torch import ExchangeDataset

        self.dataset = ExchangeDataset("slow-rank", BATCH, columns=["id"], balance="pad", shuffle=False,
                                       rank=rank, world_size=2, **settings)
        self.hold, self.read, self.ids, self.steps, self.error = hold, 0, [], 0, None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            for batch in self.dataset:
                self.ids.append(batch["id"].numpy().copy())
                self.read += len(self.ids[-1])
                self.steps += 1
                if self.steps == 1:
                    self.first.set()
                    if self.hold is not None and not self.hold.wait(3 * WAIT):
                        raise AssertionError("the slow rank was never let go")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _wait(cond, what: str, *threads: threading.Thread) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():
        for t in threads:
            if getattr(t, "error", None) is not None:
                raise AssertionError(f"{what}: {t.error!r}") from t.error
        assert time.monotonic() < deadline, f"timed out after {WAIT} s waiting for {what}: " + ", ".join(
            f"{type(t).__name__}: written={getattr(t, 'written', None)} read={getattr(t, 'read', None)} "
            f"partition={getattr(t, 'partition', None)!r} alive={t.is_alive()}" for t in threads)
        time.sleep(0.05)


@pytest.mark.parametrize("partition_type", ["PIPELINED_BOUNDED", "HYBRID"])
def test_a_slow_rank_holds_back_only_its_own_producers(tmp_service, partition_type):
    svc = tmp_service(conf={"memory.budget": "4m"})
    settings = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret, "partitionType": partition_type,
                **SMALL}
    config = client_config(svc, exchange="slow-rank", partitioner="hash", keys="k", numSubpartitions=2,
                           **{k: v for k, v in settings.items() if k not in ("coordinator", "service", "secret")})
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    hold = threading.Event()
    fast, slow = Rank(0, settings), Rank(1, settings, hold)
    producers = [Producer(handle, 0), Producer(handle, 1)]
    everyone = (fast, slow, *producers)
    committed = False
    try:
        fast.start()
        slow.start()
        for p in producers:
            p.start()
        _wait(slow.first.is_set, "the slow rank's first batch", *everyone)
        if partition_type == "PIPELINED_BOUNDED":
            # producer 0 writes everything and rank 0 reads it all while rank 1 reads nothing more (rank 0's
            # epoch ends only with every producer's end, as it reads subpartition 0 of producer 1 too) ...
            _wait(lambda: producers[0].partition is not None and fast.read == ROWS,
                  "producer 0 to finish and rank 0 to read its rows", *everyone)
            # ... and producer 1, whose only reader is the slow rank, waits for credit: what it has written
            # is bounded by its pool, the slow rank's credit and its sort buffer (about 1 MB), not its 7 MB
            assert producers[1].partition is None and producers[1].is_alive()
            assert producers[1].written < ROWS // 4, producers[1].written
            assert slow.read == BATCH
        else:
            # HYBRID: both producers write everything while the slow rank still reads nothing
            _wait(lambda: all(p.partition is not None for p in producers), "both producers to finish", *everyone)
            assert slow.read == BATCH
        hold.set()
        _wait(lambda: all(p.partition is not None for p in producers), "both producers to finish", *everyone)
        wh.commit_write(handle, [p.partition for p in producers])
        committed = True
        _wait(lambda: not fast.is_alive() and not slow.is_alive(), "both ranks to finish", *everyone)
    finally:
        hold.set()
        if not committed:
            wh.abort_write(handle, "test ended")
    assert fast.error is None and slow.error is None, (fast.error, slow.error)
    for rank, p in ((fast, producers[0]), (slow, producers[1])):
        got = np.sort(np.concatenate(rank.ids))
        assert np.array_equal(got, np.arange(ROWS) + p.index * ROWS), f"rank {p.index} did not read its rows once"
    assert fast.steps == slow.steps == -(-ROWS // BATCH)
