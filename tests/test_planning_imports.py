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
