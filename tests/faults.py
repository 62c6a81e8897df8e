"""Custom partitioners used by the Spark tests; they run inside the writer's Python worker."""
from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa

_batches_seen = 0


def by_id_mod(batch: pa.RecordBatch, n: int) -> np.ndarray:
    """Subpartition = id mod n: a custom placement the tests can predict."""
    ids = batch.column("id").to_numpy(zero_copy_only=False)
    return (ids % n).astype(np.int32)


def kill_first_attempt(batch: pa.RecordBatch, n: int) -> np.ndarray:
    """id mod n, but the first attempt of task 0 kills its own Python worker (kill -9) mid-way.

    It leaves a marker in the runtime directory first, so the test can tell the kill happened.
    """
    global _batches_seen
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        _batches_seen += 1
        if _batches_seen > 2:
            marker = os.path.join(os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"], "kill-marker")
            with open(marker, "a") as f:
                f.write(f"{os.getpid()} after {_batches_seen - 1} batches\n")
            os.kill(os.getpid(), signal.SIGKILL)
    return by_id_mod(batch, n)
