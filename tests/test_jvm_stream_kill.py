"""kill -9 of stream applications through the plugin jar's JVM stream source and sink, restarted from their
checkpoints (tests/app_jvm_stream_kill.py; the service is this test's, so it outlives them):

* the writer application (parquet files -> stream a, the JVM sink in micro-batches) killed mid-batch, after half of
  a micro-batch's rows were pushed and a Real-time Mode reader took some of them;
* the reader application (a -> Real-time Mode -> stream b by the JVM sink; a -> micro-batches -> parquet), which
  outlived its writer, killed while its Real-time Mode batch reads and writes;
* one application restarts both from their checkpoints.

The checker reads the final sinks: parquet written by the micro-batch reader, and stream b's committed epochs read
into parquet: every row of the files exactly once, as the streaming guide states for a replayable upstream. The
service (memory.budget 4 MiB) holds at most its budget in buffers all along, and the writer waits for the Real-time
Mode reader's group (stream.maxRetainedBytes)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

APP = Path(__file__).parent / "app_jvm_stream_kill.py"
FILES, ROWS, GATE = 4, 40_000, 2  # the first writer dies in the micro-batch of file GATE
BUDGET = 4 << 20  # the service's memory.budget
MAX_RETAINED = 200_000  # the writer's stream.maxRetainedBytes: about one epoch of a (lz4)


class App:
    """One application of the kill test, in a session (process group) of its own: kill -9 ends it all (its JVM,
    its Python workers), and nothing else."""

    def __init__(self, tmp: Path, jar: Path, mode: str, *flags: str, env: dict) -> None:
        self.log = open(tmp / f"{mode}{''.join(flags)}-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen([sys.executable, str(APP), str(jar), mode, *flags], stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def result(self, timeout: float) -> dict:
        try:
            stdout, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.log.seek(0)
        assert self.proc.returncode == 0, self.log.read()[-6000:]
        return json.loads(stdout.strip().splitlines()[-1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()[-6000:]


class Watch:
    """The service's memory and stream a's writer, sampled from its status while the applications run."""

    def __init__(self, svc) -> None:
        self.svc = svc
        self.used = 0
        self.writer_waited = 0.0  # the longest wait of a's writer on its slowest consumer group seen

    def sample(self) -> None:
        status = self.svc.status()
        self.used = max(self.used, status["memory"]["used"])
        for stream in status["exchanges"]:
            if stream["name"] == "a" and stream.get("writer_waiting_s"):
                self.writer_waited = max(self.writer_waited, stream["writer_waiting_s"])


def until(what: str, ok, apps: list[App], watch: Watch, seconds: float = 240) -> None:
    """Poll ``ok`` until true (bounded; failing early when an application died), sampling the service."""
    deadline = time.monotonic() + seconds
    while not ok():
        watch.sample()
        for app in apps:
            assert app.alive(), f"{what}: application ended first\n{app.stderr()}\n{app.proc.stdout.read()}"
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.2)


def inside(checkpoint: Path, epoch: int) -> bool:
    """Whether a committed batch of the Real-time Mode query ended with a subpartition inside ``epoch``."""
    for commit in (checkpoint / "commits").glob("[0-9]*"):
        offsets = (checkpoint / "offsets" / commit.name).read_text().strip().splitlines()[-1]
        if any(sub["epoch"] == epoch and any(sub["rows"].values())
               for sub in json.loads(offsets).get("subpartitions", {}).values()):
            return True
    return False


def epoch_traffic(svc, stream: str, epoch: int) -> dict:
    return svc.status()["exchange_traffic"].get(f"{stream}#{epoch}", {})


def test_kill_9_of_the_writer_and_of_the_reader_application_loses_no_row_and_repeats_none(tmp_path, jar):
    from harness import start_service

    svc = start_service(tmp_path / "svc", conf={"memory.budget": str(BUDGET)})
    watch = Watch(svc)
    work = tmp_path / "work"
    src = work / "src"
    start = time.time() - 3600
    for f in range(FILES):  # one file per writer micro-batch, in date order
        ids = range(f * ROWS, (f + 1) * ROWS)
        (src / f"f{f}").mkdir(parents=True)
        path = src / f"f{f}" / "part-0.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array([i % 4 for i in ids], pa.int32())}),
                       path)
        os.utime(path, (start + f, start + f))
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.sparkflow.exchange.coordinator {svc.tcp}\nspark.sparkflow.exchange.service {svc.tcp}\n"
        f"spark.sparkflow.exchange.secretFile {svc.home / 'secret'}\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONF_DIR": str(conf), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime"),
           "KILL_WORK": str(work), "KILL_FILES": str(FILES), "KILL_ROWS": str(ROWS), "KILL_GATE": str(GATE),
           "KILL_COORDINATOR": svc.tcp, "KILL_SECRET": svc.secret, "KILL_MAX_RETAINED": str(MAX_RETAINED)}
    apps: list[App] = []
    try:
        writer = App(tmp_path, jar, "write", "--gate", env=env)
        reader = App(tmp_path, jar, "read", env=env)
        apps += [writer, reader]
        # the writer pushed half of the gated micro-batch, and the Real-time Mode reader checkpointed a batch that
        # ended inside it (rows taken of its producer task): the replay must not give those rows again
        until("half an epoch written, read and checkpointed", lambda: (work / "halfway").exists()
              and inside(work / "rt-ck", GATE), [writer, reader], watch)
        writer.kill()
        # the Real-time Mode reader outlives its writer: it ends a batch after the writer's death, not failing
        batches = len(list((work / "rt-ck" / "commits").glob("[0-9]*")))
        until("a Real-time Mode batch after the writer's death",
              lambda: len(list((work / "rt-ck" / "commits").glob("[0-9]*"))) > batches, [reader], watch)
        reader.kill()  # mid-batch: Real-time Mode batches run back to back
        restart = App(tmp_path, jar, "restart", env=env)  # both from their checkpoints: the writer replays the batch
        apps.append(restart)
        until("the restarted writer and readers done", lambda: not restart.alive(), [], watch, seconds=400)
        done = restart.result(10)
        memory = svc.status()["memory"]
    finally:
        for app in apps:
            if app.alive():
                app.kill()
        svc.stop()
    assert not done["errors"], done["errors"]
    assert done["writer"] == "sparkflow-exchange stream a (JVM sink)", done["writer"]
    assert done["sources"] == ["sparkflow-exchange stream a (JVM)"], done["sources"]
    every = {"rows": FILES * ROWS, "distinct": FILES * ROWS, "min": 0, "max": FILES * ROWS - 1}
    # the micro-batch reader's parquet, and stream b's committed epochs: every row once
    assert done["sinks"] == {"mb-out": every, "b-out": every}, done["sinks"]
    # the Real-time Mode reader's group moves at its batches' ends: the writer waited for it (maxRetainedBytes); the
    # buffers the service held stayed within its memory budget (HYBRID: on disk, memory a cache)
    assert watch.writer_waited > 0, "the writer never waited for its readers"
    assert watch.used <= memory["peak_used"] <= BUDGET, (watch.used, memory, BUDGET)
    print(f"memory.budget {BUDGET}: buffers held at most {memory['peak_used']}, held or promised at most "
          f"{memory['peak_reserved']}; the writer waited up to {watch.writer_waited:.1f} s for its readers")
