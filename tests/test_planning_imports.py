"""Spark imports ``pyspark_pipelined`` in every short-lived planning worker (lookup, write, commit, schema,
read plan) of every application; most of them never use the exchange client, so the import stays light."""
from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyarrow", "numpy", "sparkflow_exchange.exchange", "sparkflow_exchange.streaming",
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
    from sparkflow_exchange.datasource import PipelinedWriter
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
