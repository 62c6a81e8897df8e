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

CLIENT = r"""
import json, os, time
import pyarrow as pa
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.service.discovery import runtime_dir

def service_pid():
    return json.loads((runtime_dir() / "embedded.json").read_text())["pid"]

config = ExchangeConfig.load().replace(exchange="lifetime", partitioner="rebalance", num_subpartitions=2)
schema = pa.schema([("id", pa.int64())])
handle = ex.declare_write(config, schema, overwrite=True)
task = ex.ProducerTask(handle, 0, "0-0-0")
task.write([pa.record_batch([pa.array(range(1000), pa.int64())], schema=schema)])
ex.commit_write(handle, [task.finish()["partition"]])
first = service_pid()
reads = []
deadline = time.monotonic() + 3.5  # three and a half idle timeouts of reads of the one exchange
while time.monotonic() < deadline:
    desc = ex.describe_exchange(config, wait=False)
    reads.append(sum(b.num_rows for sub in range(2) for b in ex.read_subpartition(config, desc, sub)))
    time.sleep(0.2)
print(json.dumps({"reads": reads, "pids": [first, service_pid()]}))
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
    # the client has ended: the service follows once the idle timeout has passed
    state = runtime / "embedded.json"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and state.exists():
        time.sleep(0.2)
    assert not state.exists(), "embedded service still running after its only client ended"
