"""The embedded service's lifetime when no JVM uses it: a plain Python program on the client API.

Found by a benchmark script: with no Spark JVM above it, nothing was attached, so the service exited
``embedded.idleTimeout`` after it started, in the middle of the script's writes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sparkflow_exchange.service.spill_root import SPILL_PREFIX

CLIENT = r"""
import json, os, time
import pyarrow as pa
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import runtime_dir

def service_pid():
    return json.loads((runtime_dir() / "embedded.json").read_text())["pid"]

config = ExchangeConfig.load().replace(exchange="lifetime", partitioner="rebalance", num_subpartitions=2)
schema = pa.schema([("id", pa.int64())])
handle = ex.declare_write(config, schema, overwrite=True)
task = ex.ProducerTask(handle, 0, "0-0-0")
task.write([pa.record_batch([pa.array(range(1000), pa.int64())], schema=schema)])
wh.commit_write(handle, [task.finish()["partition"]])
first = service_pid()
reads = []
deadline = time.monotonic() + 3.5  # three and a half idle timeouts of reads of the one exchange
while time.monotonic() < deadline:
    desc = ex.describe_exchange(config, wait=False)
    reads.append(sum(b.num_rows for sub in range(2) for b in ex.read_subpartition(config, desc, sub)))
    time.sleep(0.2)
print(json.dumps({"reads": reads, "pids": [first, service_pid()]}))
ex.drop_exchange("lifetime", config)  # else the service keeps it for later readers
"""


def test_a_python_client_without_jvm_keeps_the_embedded_service_while_it_runs(tmp_path):
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime),
           "SPARKFLOW_EXCHANGE_CONF": json.dumps({"embedded.idleTimeout": "1s"})}
    proc = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["reads"]) >= 5 and set(result["reads"]) == {1000}
    assert result["pids"][0] == result["pids"][1], "the embedded service was replaced while its client ran"
    # the client has ended, its exchange dropped: the service follows once the idle timeout has passed
    state = runtime / "embedded.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and state.exists():
        time.sleep(0.2)
    assert not state.exists(), "embedded service still running after its only client ended"


WRITER = r"""
import json, sys
import pyarrow as pa
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import runtime_dir

config = ExchangeConfig.load().replace(exchange=sys.argv[1], partitioner="hash", keys=("id",), num_subpartitions=2)
schema = pa.schema([("id", pa.int64())])
handle = ex.declare_write(config, schema, overwrite=True)
task = ex.ProducerTask(handle, 0, "0-0-0")
task.write([pa.record_batch([pa.array(range(5000), pa.int64())], schema=schema)])
wh.commit_write(handle, [task.finish()["partition"]])
print(json.loads((runtime_dir() / "embedded.json").read_text())["pid"])
"""

READER = r"""
import json, sys
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import runtime_dir

config = ExchangeConfig.load().replace(exchange=sys.argv[1])
desc = ex.describe_exchange(config, wait=False)
ids = sorted(v for sub in range(2) for b in ex.read_subpartition(config, desc, sub) for v in b.column(0).to_pylist())
pid = json.loads((runtime_dir() / "embedded.json").read_text())["pid"]
ex.drop_exchange(sys.argv[1], config)
print(json.dumps({"pid": pid, "ids_ok": ids == list(range(5000))}))
"""


def _client(code: str, env: dict, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def _exits_leaving_nothing(pid: int, runtime: Path) -> None:
    import tempfile

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "the embedded service did not exit once it held nothing"
    assert sorted(p.name for p in runtime.iterdir()) == [], "files left in the runtime directory"
    assert not list(Path(tempfile.gettempdir()).glob(f"{SPILL_PREFIX}{pid}-*")), "spill directory left behind"


def test_an_exchange_outlives_its_writer_and_the_service_exits_once_it_is_dropped(tmp_path):
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime),
           "SPARKFLOW_EXCHANGE_CONF": json.dumps({"embedded.idleTimeout": "1s"})}
    from harness import stop_embedded

    try:
        pid = int(_client(WRITER, env, "kept"))
        time.sleep(4)  # four idle timeouts with no application: the service holds an exchange, so it stays
        assert Path(f"/proc/{pid}").exists(), "the embedded service exited while it held an exchange"
        result = json.loads(_client(READER, env, "kept"))
        assert result == {"pid": pid, "ids_ok": True}
        _exits_leaving_nothing(pid, runtime)
    finally:
        stop_embedded(runtime)


def test_an_exchange_expires_after_ttl_and_the_service_exits_leaving_nothing(tmp_path):
    _expires_after_ttl_leaving_nothing(tmp_path, WRITER, "short-lived")


STREAM_WRITER = r"""
import json
import numpy as np
import pyarrow as pa
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.spark import streaming as st
from sparkflow_exchange.buffer_kinds import epoch_marker
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import runtime_dir

config = ExchangeConfig.load().replace(exchange="stopped-stream", partitioner="hash", keys=("id",), num_subpartitions=2)
schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
handle = st.declare_stream(config, schema)
task = ex.ProducerTask(st.begin_epoch(handle, 0, "writer-query"), 0, "0-0")
task.write([pa.record_batch([pa.array(np.arange(100), pa.int64())], schema=schema)])
result = task.finish(epoch_marker(0))
st.commit_epoch(handle, 0, [result["partition"]], {result["partition"]: result["rows"]})
print(json.loads((runtime_dir() / "embedded.json").read_text())["pid"], flush=True)
"""


def test_a_stream_whose_queries_stopped_expires_after_ttl_and_the_service_exits(tmp_path):
    """A stream (one epoch written) whose writer query is gone is dropped after ``ttl``, and the embedded service
    exits as it does for a batch exchange."""
    _expires_after_ttl_leaving_nothing(tmp_path, STREAM_WRITER)


ABANDONING_WRITER = r"""
import json, os, sys
import pyarrow as pa
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import runtime_dir

config = ExchangeConfig.load().replace(exchange="abandoned", partitioner="hash", keys=("id",), num_subpartitions=2)
schema = pa.schema([("id", pa.int64())])
handle = ex.declare_write(config, schema, overwrite=True)
task = ex.ProducerTask(handle, 0, "0-0-0")
task.write([pa.record_batch([pa.array(range(5000), pa.int64())], schema=schema)])
print(json.loads((runtime_dir() / "embedded.json").read_text())["pid"], flush=True)
os._exit(0)  # gone without finishing, committing or aborting: as a killed application
"""


def test_a_write_left_open_by_an_application_that_is_gone_expires_after_ttl(tmp_path):
    _expires_after_ttl_leaving_nothing(tmp_path, ABANDONING_WRITER)


def _expires_after_ttl_leaving_nothing(tmp_path: Path, code: str, *args: str) -> None:
    """``code`` leaves data in an embedded service with a 2 s ttl and ends: the service drops it and exits."""
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime),
           "SPARKFLOW_EXCHANGE_CONF": json.dumps({"embedded.idleTimeout": "1s", "ttl": "2s"})}
    from harness import stop_embedded

    try:
        pid = int(_client(code, env, *args))
        _exits_leaving_nothing(pid, runtime)
    finally:
        stop_embedded(runtime)


def test_the_plugin_launcher_starts_the_embedded_service_for_a_jvm_and_it_lives_as_long_as_that_jvm(tmp_path):
    """``python -m sparkflow_exchange.service.plugin embedded --jvm-pid P`` (what the jar runs for a first
    ``format("pipelined")`` write that finds no service): the service is attached to P, not to the launcher."""
    runtime = tmp_path / "runtime"
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(runtime),
           "SPARKFLOW_EXCHANGE_CONF": json.dumps({"embedded.idleTimeout": "1s"})}
    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # stands in for the JVM
    try:
        proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.service.plugin", "embedded", "--jvm-pid",
                               str(jvm.pid)], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        state = json.loads((runtime / "embedded.json").read_text())
        assert answer == {"unix": state["unix"], "pid": state["pid"]}
        time.sleep(2.5)  # the launcher has ended; past the idle timeout the service stays for its JVM
        assert Path(f"/proc/{state['pid']}").exists() and (runtime / "embedded.json").exists()
    finally:
        jvm.kill()  # our own stand-in, by its pid
        jvm.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (runtime / "embedded.json").exists():
        time.sleep(0.2)
    assert not (runtime / "embedded.json").exists(), "embedded service still running after its JVM ended"


def test_stopping_an_embedded_service_that_exits_as_another_process_zombie_returns_at_once(tmp_path):
    """The service of an application that is still running but does not reap it stays a zombie after SIGTERM:
    ``stop_embedded`` counts it as gone instead of waiting out its timeout."""
    from sparkflow_exchange.service.launcher import write_state
    from sparkflow_exchange.service.process import stop_embedded

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                               "child = subprocess.Popen(['sleep', '60'])\nprint(child.pid, flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        write_state(tmp_path / "embedded.json", {"pid": pid})
        started = time.monotonic()
        assert stop_embedded(tmp_path, timeout=20) == pid
        waited = time.monotonic() - started
        stat = Path(f"/proc/{pid}/stat").read_text()
        assert stat.rsplit(") ", 1)[1][0] == "Z"  # ended, and not reaped by its parent
        assert waited < 10, f"stop_embedded waited {waited:.1f} s on a zombie"
    finally:
        parent.kill()  # our own child, by its pid
        parent.wait()
