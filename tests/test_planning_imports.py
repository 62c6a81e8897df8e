"""Spark imports ``pyspark_pipelined`` in every short-lived planning worker (lookup, write, commit, schema,
read plan) of every application; most of them never use the exchange client, so the import stays light."""
from __future__ import annotations

import subprocess
import sys

from harness import fresh_python

HEAVY = ("pyarrow", "numpy", "sparkflow_exchange.exchange", "sparkflow_exchange.spark.streaming",
         "sparkflow_exchange.network.blocking_client", "sparkflow_exchange.service.discovery")


def test_importing_the_data_source_loads_no_arrow_and_no_client():
    code = f"import sys, pyspark_pipelined; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"loaded at import: {out.stdout.strip()}"


def test_the_commit_worker_unpickles_the_writer_without_arrow_or_the_data_path():
    """Spark commits a write in a fresh planning worker: it unpickles the writer (and its handle) and calls
    commit, which needs only the coordinator client."""
    import pickle

    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.spark.datasource import PipelinedWriter
    from sparkflow_exchange.write_handle import WriteHandle

    handle = WriteHandle(ExchangeConfig.load({"exchange": "orders"}), "orders", 3, "w-1", "c2NoZW1h", 8, "hash")
    blob = pickle.dumps(PipelinedWriter(handle, {"exchange": "orders"}))
    heavy = ("pyarrow", "numpy", "asyncio", "sparkflow_exchange.exchange")
    code = (f"import pickle, sys; w = pickle.loads({blob!r}); from sparkflow_exchange.write_handle import commit_write; "
            f"assert w.handle.epoch == 3 and w.handle.name == 'orders', w.handle; "
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"loaded to commit: {out.stdout.strip()}"


def test_planning_a_read_loads_no_data_path(tmp_service):
    """Spark asks a read's schema and its plan in fresh planning workers: the light client and pyarrow.ipc
    answer both, against a real exchange."""
    import numpy as np
    import pyarrow as pa

    import sparkflow_exchange as sfe

    svc = tmp_service()
    settings = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
    batch = pa.record_batch({"id": pa.array(np.arange(100)), "k": pa.array(np.arange(100) % 7)})
    with sfe.open_writer("planned", batch.schema, keys=["k"], num_subpartitions=4, **settings) as w:
        w.write(batch)
    heavy = ("asyncio", "sparkflow_exchange.exchange", "sparkflow_exchange.consumer.input_gate")  # pyarrow loads numpy
    code = ("import sys\n"
            "from sparkflow_exchange.spark.datasource import PipelinedDataSource\n"
            f"ds = PipelinedDataSource({{'exchange': 'planned', **{settings!r}}})\n"
            "schema = ds.schema()\n"
            "parts = ds.reader(schema).partitions()\n"
            "assert schema.fieldNames() == ['id', 'k'] and len(parts) == 4, (schema, parts)\n"
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n")
    loaded = fresh_python(code)
    assert loaded == "", f"loaded to plan a read: {loaded}"


def test_a_service_loads_what_a_writes_commit_needs_before_any_write(tmp_service):
    """The service's start leaves numpy out (it is ready sooner), but imports it on its own once ready: the first
    write's producers do not wait for that import inside their commit (nothing here writes or calls it)."""
    import time
    from pathlib import Path

    svc = tmp_service()
    maps = Path(f"/proc/{svc.proc.pid}/maps")
    deadline = time.monotonic() + 60
    while "_multiarray_umath" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "_multiarray_umath" in maps.read_text(), "the service never imported numpy by itself"
