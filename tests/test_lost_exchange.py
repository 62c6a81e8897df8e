"""An exchange lost with its service (killed after the write) says so at once, instead of waiting
declareTimeout and then calling the exchange unknown."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import ExchangeLost, ExchangeNotFound
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh

SCHEMA = pa.schema([pa.field("a", pa.int64())])


def write(cfg, rows: int = 100) -> None:
    handle = ex.declare_write(cfg, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([pa.record_batch([pa.array(range(rows))], schema=SCHEMA)])
    wh.commit_write(handle, [task.finish()["partition"]])


def test_successor_of_a_killed_service_knows_its_exchanges_were_lost(tmp_service, tmp_path):
    state = tmp_path / "embedded.json"
    first = tmp_service(extra=["--state-file", str(state)])
    write(client_config(first, exchange="held", keys="a", numSubpartitions=2))
    write(client_config(first, exchange="gone-on-purpose", keys="a", numSubpartitions=2))
    ex.drop_exchange("gone-on-purpose", client_config(first))
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = tmp_service(extra=["--state-file", str(state)])
    start = time.monotonic()
    with pytest.raises(ExchangeLost, match=rf"exchange 'held' was lost: .*\(pid {first.proc.pid}\) ended without shutting down"):
        ex.describe_exchange(client_config(second, exchange="held", declareTimeout="30"))
    assert time.monotonic() - start < 5
    # a dropped exchange was not lost: it does not exist (and is waited for as before)
    with pytest.raises(ExchangeNotFound, match="does not exist"):
        ex.describe_exchange(client_config(second, exchange="gone-on-purpose", declareTimeout="0.2"))
    # writing the name again ends the mark
    write(client_config(second, exchange="held", keys="a", numSubpartitions=2), rows=7)
    desc = ex.describe_exchange(client_config(second, exchange="held"))
    cfg = client_config(second, exchange="held")
    assert sum(b.num_rows for s in range(2) for b in ex.read_subpartition(cfg, desc, s)) == 7
    # a clean exit leaves no ledger behind
    ledger = state.with_suffix(".exchanges.json")
    assert json.loads(ledger.read_text())["exchanges"] == ["held"]
    assert second.stop(signal.SIGTERM) == 0
    assert not ledger.exists()


def test_lost_marks_survive_a_second_crash_and_drop_clears_them(tmp_service, tmp_path):
    state = tmp_path / "embedded.json"
    first = tmp_service(extra=["--state-file", str(state)])
    write(client_config(first, exchange="held", keys="a", numSubpartitions=2))
    first.stop(signal.SIGKILL)
    second = tmp_service(extra=["--state-file", str(state)])
    second.stop(signal.SIGKILL)
    third = tmp_service(extra=["--state-file", str(state)])
    with pytest.raises(ExchangeLost, match=f"pid {first.proc.pid}"):
        ex.describe_exchange(client_config(third, exchange="held", declareTimeout="30"))
    assert ex.drop_exchange("held", client_config(third)) == {"dropped": "held", "partitions": 0}
    with pytest.raises(ExchangeNotFound):
        ex.describe_exchange(client_config(third, exchange="held", declareTimeout="0.2"))


def test_exchanges_held_by_an_embedded_service_stopped_on_purpose_are_lost_saying_so(tmp_service, tmp_path):
    state = tmp_path / "embedded.json"
    first = tmp_service(extra=["--state-file", str(state), "--embedded", "--hold-exchanges"])
    write(client_config(first, exchange="held", keys="a", numSubpartitions=2))
    assert first.stop(signal.SIGTERM) == 0
    second = tmp_service(extra=["--state-file", str(state), "--embedded", "--hold-exchanges"])
    with pytest.raises(ExchangeLost, match=rf"exchange 'held' was lost: .*\(pid {first.proc.pid}\) was stopped at "):
        ex.describe_exchange(client_config(second, exchange="held", declareTimeout="30"))


@pytest.mark.spark
def test_read_after_the_embedded_service_was_killed_fails_at_once_saying_lost(tmp_path):
    env = {**os.environ, "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "app_lost_exchange.py")], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert f"sparkflow_exchange.ExchangeLost: exchange 'doomed' was lost: the exchange service that held it " \
           f"(pid {result['victim']}) ended without shutting down" in result["error"], result["error"][:3000]
    assert "Traceback (most recent call last)" not in result["error"]
    # the read waits up to declareTimeout (900 s) for an exchange that is merely not there yet: failing well
    # before that is failing at once, on a loaded machine too
    assert result["failed_after"] < 300, result["failed_after"]
