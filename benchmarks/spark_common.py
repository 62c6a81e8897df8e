"""What the Spark benchmarks share: the floor's no-op sink and prepared-batch source, settling, cleanup.

The floor is what any Python data source pays to move the rows out of Spark and back in, with the
same task counts as the exchange case: a no-op Arrow sink, then a source yielding prepared Arrow
batches (memory-mapped IPC files, one per read partition, batches of about ``bufferSize`` bytes).
Workers import this module: the scripts put ``benchmarks/`` on ``PYTHONPATH`` before Spark starts.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bare_floor import BareReader, BareWriter  # the floor's sink and source, plus what each task does here
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, DataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from sparkflow_exchange.service.process import stop_embedded

SCHEMA = "id long, key long, s string, d double"


def bench_rows(spark, rows: int, partitions: int):
    """The benchmarks' rows (``SCHEMA``): long id, long key = id % 100003, a 16-character string, a double;
    ``prepare_floor_files`` writes the same ids, keys and strings."""
    return spark.range(0, rows, 1, partitions).selectExpr(
        "id", "id % 100003 AS key", "lpad(CAST(id AS STRING), 16, 'x') AS s", "rand(7) AS d")


def bench_environment(name: str) -> Path:
    """A fresh directory for one benchmark run; Spark's workers run this interpreter and find
    ``benchmarks/`` (they unpickle this module's classes), and the embedded service is this run's own.
    Call before Spark starts."""
    tmp = Path(tempfile.mkdtemp(prefix=f"sparkflow-bench-{name}-"))
    here = str(Path(__file__).parent)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARKFLOW_EXCHANGE_RUNTIME_DIR"] = str(tmp / "runtime")
    # the run's embedded service would keep what the run wrote for later readers: it ends with the run
    atexit.register(stop_embedded, tmp / "runtime")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    if here not in sys.path:
        sys.path.insert(0, here)
    return tmp


class NoopArrowSink(DataSource):
    """The floor's writer: receives every Arrow batch and drops it."""

    @classmethod
    def name(cls) -> str:
        return "floor_sink"

    def writer(self, schema, overwrite):
        return _NoopWriter()


class _NoopWriter(BareWriter):
    def write(self, iterator):
        gc.unfreeze()  # the frozen floor shares these workers: see _frozen_again
        return self.drain(iterator)

    def commit(self, messages):
        pass


class PreparedBatches(DataSource):
    """The floor's reader: options ``dir`` and ``parts``; yields part-<i>.arrow's batches in partition i."""

    @classmethod
    def name(cls) -> str:
        return "floor_source"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return _PreparedReader(self.options["dir"], int(self.options["parts"]))


class _PreparedReader(BareReader):
    def read(self, partition):
        gc.unfreeze()  # the frozen floor shares these workers: see _frozen_again
        return self.batches(partition)


def _frozen_again() -> None:
    """The frozen floor's end of task. Spark gives both floors the same Python workers (data sources
    registered from one session share a pool), so each sets the heap up for itself: the floor unfreezes
    it when a task starts (Spark's collection after the task then walks all of it, as it always does), the
    frozen floor freezes it again at a task's end when it is not frozen (what ours do once per process)."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()


class FrozenNoopArrowSink(NoopArrowSink):
    """The floor's writer in workers whose heap is frozen as ours are (``freezeWorkerHeap``)."""

    @classmethod
    def name(cls) -> str:
        return "floor_sink_frozen"

    def writer(self, schema, overwrite):
        return _FrozenNoopWriter()


class _FrozenNoopWriter(_NoopWriter):
    def write(self, iterator):
        message = self.drain(iterator)
        _frozen_again()
        return message


class FrozenPreparedBatches(PreparedBatches):
    """The floor's reader in workers whose heap is frozen as ours are."""

    @classmethod
    def name(cls) -> str:
        return "floor_source_frozen"

    def reader(self, schema):
        return _FrozenPreparedReader(self.options["dir"], int(self.options["parts"]))


class _FrozenPreparedReader(_PreparedReader):
    def read(self, partition):
        return self._then_frozen(partition)

    def _then_frozen(self, partition):
        yield from self.batches(partition)
        _frozen_again()


class StreamFloor(DataSource):
    """The streaming floor: a no-op Python stream sink (writer query) and a Python stream source of prepared
    Arrow files with one epoch (reader query, options ``dir`` and ``parts``): what PySpark charges any Python
    streaming source and sink, nothing of the exchange."""

    @classmethod
    def name(cls) -> str:
        return "floor_stream"

    def schema(self):
        return SCHEMA

    def streamWriter(self, schema, overwrite):
        return _NoopStreamWriter()

    def streamReader(self, schema):
        return _PreparedStreamReader(self.options["dir"], int(self.options["parts"]))


class _NoopStreamWriter(DataSourceStreamArrowWriter):
    def write(self, iterator):
        return _NoopWriter.drain(iterator)

    def commit(self, messages, batchId):
        pass

    def abort(self, messages, batchId):
        pass


class _PreparedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, directory: str, parts: int) -> None:
        self.prepared = _PreparedReader(directory, parts)

    def initialOffset(self):
        return {"epoch": 0}

    def latestOffset(self, start, limit):
        return {"epoch": 1}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start, end):
        return self.prepared.partitions() if start["epoch"] < end["epoch"] else []

    def read(self, partition):
        return self.prepared.batches(partition)

    def commit(self, end):
        pass


def prepare_floor_files(rows: int, directory: Path, batch_bytes: int, parts: int) -> None:
    """The generated DataFrame's rows in ``parts`` Arrow IPC files of about batch_bytes batches."""
    directory.mkdir(parents=True)
    schema = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("s", pa.string()), ("d", pa.float64())])
    per = -(-rows // parts)
    for index in range(parts):
        ids = np.arange(index * per, min(rows, (index + 1) * per), dtype=np.int64)
        table = pa.table({"id": ids, "key": ids % 100_003,
                          "s": pc.utf8_lpad(pc.cast(pa.array(ids), pa.string()), 16, "x"),
                          "d": np.random.default_rng(index).random(len(ids))}, schema=schema)
        rows_per_batch = max(1, len(ids) * batch_bytes // max(table.nbytes, 1))
        with pa.OSFile(str(directory / f"part-{index}.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, schema) as writer:
            for batch in table.to_batches(max_chunksize=rows_per_batch):
                writer.write_batch(batch)


def settle(spark) -> None:
    """Start every case from the same state: the previous case's dirty pages written back, the driver's heap collected."""
    os.sync()
    spark._jvm.java.lang.System.gc()
    time.sleep(0.5)


def service_pids(runtime: Path) -> list[int]:
    pids = []
    for state in runtime.glob("*.json"):
        try:
            pid = json.loads(state.read_text()).get("pid")
        except (OSError, ValueError):
            continue
        if isinstance(pid, int):
            pids.append(pid)
    return pids


def stop_embedded_services(runtime: Path) -> list[int]:
    """Stop the exchange service(s) this run started (found by pid in the runtime dir)."""
    stopped = []
    for pid in service_pids(runtime):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stopped.append(pid)
    return stopped


def interleaved_rounds(spark, cases: dict, repeat: int) -> dict[str, list[float]]:
    """Seconds of every case in each of ``repeat`` rounds, the cases taking turns within a round (so a
    slow spell of the machine falls on all of them), each from a settled state."""
    times: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(repeat):
        for label, fn in cases.items():
            settle(spark)
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return times


def wide_session(app: str, width: int, tcp_workers: bool = False):
    """The wide benchmarks' session: ``local[2]``, AQE off, ``spark.sql.shuffle.partitions=width``, the recommended
    settings (``tcp_workers``: Spark's default TCP sockets to its Python workers instead of Unix sockets)."""
    from pyspark.sql import SparkSession

    from sparkflow_exchange.spark.session_tuning import PYTHON_WORKER_UNIX_SOCKETS, SPARK_SETTINGS

    settings = {**SPARK_SETTINGS, **({PYTHON_WORKER_UNIX_SOCKETS: "false"} if tcp_workers else {})}
    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(width)).config("spark.sql.adaptive.enabled", "false")
             .config("spark.driver.memory", "3g").config(map=settings).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def end_run(spark, tmp: Path) -> None:
    """Stop the session, then the exchange services this run started (by pid), and remove the run's dir."""
    if spark is not None:
        spark.stop()
    stopped = stop_embedded_services(tmp / "runtime")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"(stopped exchange service pid(s) {stopped}; removed {tmp})")


def stat_cpu_seconds(stat: str) -> float:
    """User and system CPU-seconds in the text of a ``/proc`` stat file: a process's (every thread) or one thread's
    (``/proc/<pid>/task/<tid>/stat``)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU-seconds of process ``pid`` so far (every thread; ``/proc/<pid>/stat``), None once it is
    gone."""
    try:
        return stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def status_kib(pid: int, field: str) -> int:
    """A /proc/<pid>/status field in KiB (VmRSS, VmHWM), 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
