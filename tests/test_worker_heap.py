"""Workers freeze their long-lived heap after their first read and write task (worker_heap.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

from chispa import assert_df_equality

PROBE = textwrap.dedent("""
    import gc, json, sys, weakref
    from pyspark import TaskContext
    from sparkflow_exchange.spark.worker_heap import freeze_after_first, freezing_after

    out = {"outside_task": freeze_after_first("read")}
    out["frozen_outside"] = gc.get_freeze_count()
    TaskContext._setTaskContext(TaskContext())  # what Spark's worker does before it runs a task
    out["disabled"] = freeze_after_first("write", enabled=False)
    out["frozen_disabled"] = gc.get_freeze_count()

    class Gate:
        pass

    gates = []

    class Rows:  # what a read task's iterator holds: objects in a cycle (a gate and its channels)
        def __init__(self):
            self.gate = Gate()
            self.gate.channels = [self.gate]
            gates.append(weakref.ref(self.gate))

        def __iter__(self):
            return iter([1, 2, 3])

    out["rows"] = list(freezing_after(Rows(), "read"))  # Spark holds only the outer iterator
    out["task_objects_collected"] = gates[0]() is None
    out["frozen_read"] = gc.get_freeze_count()
    out["second_read"] = freeze_after_first("read")
    out["first_write"] = freeze_after_first("write")
    print(json.dumps(out))
""")


def test_freeze_once_per_kind_only_inside_a_task_and_only_when_enabled():
    import json

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["outside_task"] is False and out["frozen_outside"] == 0
    assert out["disabled"] is False and out["frozen_disabled"] == 0
    assert out["rows"] == [1, 2, 3]
    assert out["task_objects_collected"], "the freeze kept the finished task's cyclic objects for good"
    assert out["frozen_read"] > 10_000  # pyspark's and pyarrow's modules, classes and functions
    assert out["second_read"] is False
    assert out["first_write"] is True


def test_spark_workers_freeze_after_our_tasks_and_still_read_exactly(spark, tmp_path):
    """The second write's tasks run in workers our earlier tasks froze (Spark reuses them); the custom
    partitioner runs inside those tasks and reports each worker's frozen count."""
    from pyspark.sql import functions as F

    name = f"heap-{uuid.uuid4().hex[:6]}"
    probe = tmp_path / "frozen.txt"
    df = spark.range(0, 20_000, 1, 4).selectExpr("id", "id % 97 AS key").withColumn("probe", F.lit(str(probe)))
    for _ in range(2):
        df.write.format("pipelined").mode("overwrite").option("exchange", name) \
            .option("partitioner", "custom").option("custom", "probe_sink:heap_probe_partitioner") \
            .option("numSubpartitions", "2").save()
    for _ in range(2):  # the second read runs in workers frozen by the first: the same rows
        assert_df_equality(df, spark.read.format("pipelined").option("exchange", name).load(),
                           ignore_row_order=True)
    seen = [line.split() for line in probe.read_text().splitlines()]
    assert len(seen) == 8, seen  # one batch per write task
    assert max(int(count) for _pid, count in seen[4:]) > 10_000, seen
    from sparkflow_exchange import drop_exchange

    drop_exchange(name, spark=spark)
