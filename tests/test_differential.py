"""The differential tester (scripts/differential.py): its comparison finds wrong answers (without Spark), and a
short seeded run, every writer against every reader in one Spark application, finds none.

``SPARKFLOW_DIFFERENTIAL_DISABLE`` (comma separated, default: none) leaves generators out of the run, by the
names of ``differential_data.Features`` (``other_layout_append``, ``case_collision``, ``failing_overwrite``,
``zero_columns``, ``collation``, ``broadcast_catalog``, ``failing_replace_catalog``).
"""
from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

from differential_data import (  # noqa: E402
    BY_NAME,
    Column,
    ExchangeModel,
    Features,
    Layout,
    canon,
    canon_rows,
    other_layouts,
    random_layout,
    random_rows,
)
from differential_run import Runner, clear_error  # noqa: E402

SEED = 11
STEPS = 22
DISABLED = os.environ.get("SPARKFLOW_DIFFERENTIAL_DISABLE", "")


def test_canonical_rows_keep_float_bits_and_ignore_map_order():
    assert canon(-0.0) != canon(0.0)
    assert canon(math.nan) == canon(float("nan"))
    assert canon(1.0) != canon(1.0000000000000002)
    assert canon([("a", 1), ("b", 2)]) == canon([("b", 2), ("a", 1)])
    assert canon([1, 2]) != canon([2, 1])
    table = pa.table({"x": pa.array([1.5, None], pa.float64())}).drop(["x"])
    assert canon_rows(table) == [(), ()]  # no columns, two rows


def test_every_other_layout_differs_from_the_exchanges():
    r = random.Random(3)
    for _ in range(200):
        layout = random_layout(r, Features())
        for what, other in other_layouts(r, layout):
            assert other != layout, what
            assert (other.partitioner, other.keys, other.n, other.columns) != \
                (layout.partitioner, layout.keys, layout.n, layout.columns), what


def test_unknown_generator_names_are_refused():
    with pytest.raises(SystemExit, match="unknown generator 'colation'"):
        Features.without(["colation"])


def _runner() -> Runner:
    runner = Runner(None, 1, Features(), prefix="t", log=lambda s: None)
    runner._reset = lambda name: None  # no service to drop it from
    return runner


def test_the_comparison_finds_a_lost_row_a_duplicate_and_a_broadcast_copy_too_many():
    layout = Layout("rebalance", (), 2, (Column("a", BY_NAME["double"]),))
    table = pa.table({"a": pa.array([0.0, -0.0, math.nan], pa.float64())})
    model = ExchangeModel(layout, [table])
    rows = canon_rows(table)
    runner = _runner()
    assert runner._compare("t0", "py", model, [(0, rows[0]), (1, rows[1]), (1, rows[2])], 2, True)
    assert not runner._compare("t0", "py", model, [(0, rows[0]), (1, rows[0]), (1, rows[2])], 2, True)  # -0.0 as 0.0
    assert not runner._compare("t0", "py", model, [(0, r) for r in rows] + [(1, rows[0])], 2, True)
    assert not runner._compare("t0", "py", model, [(0, r) for r in rows], 3, True)  # 3 read partitions, not 2
    broadcast = ExchangeModel(Layout("broadcast", (), 2, layout.columns), [table])
    assert runner._compare("t0", "catalog", broadcast, [(p, r) for p in (0, 1) for r in rows], 2, False)
    assert not runner._compare("t0", "catalog", broadcast, [(0, r) for _ in (0, 1) for r in rows], 2, False)
    assert [d.kind for d in runner.found] == ["wrong_rows", "wrong_rows", "wrong_width", "broadcast_copy"]


def test_a_refusal_must_be_clear():
    assert clear_error(ValueError("append to exchange 'x' with another layout"), "x")
    assert not clear_error(RuntimeError("java.lang.NullPointerException"), "x")
    assert not clear_error(RuntimeError(""), "x")


def test_rows_follow_the_layout():
    r = random.Random(5)
    layout = random_layout(r, Features())
    table = random_rows(r, layout, 30)
    assert table.num_rows == 30 and table.column_names == [c.name for c in layout.columns]


def test_a_short_seeded_run_finds_no_wrong_answer(tmp_path):
    out = tmp_path / "differential.json"
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_CONF_DIR": str(conf), "SPARKFLOW_EXCHANGE_RUNTIME_DIR": str(tmp_path / "runtime")}
    cmd = [sys.executable, str(SCRIPTS / "differential.py"), "--seed", str(SEED), "--steps", str(STEPS),
           "--json", str(out)]
    if DISABLED:
        cmd += ["--disable", DISABLED]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    finally:
        from harness import stop_embedded

        stop_embedded(tmp_path / "runtime")
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(out.read_text())
    assert summary["discrepancies"] == 0, proc.stdout[-8000:]
    assert proc.returncode == 0, proc.stderr[-5000:]
    counts = Counter(summary["counts"])
    assert summary["steps"] == STEPS
    for side in ("write:py", "write:jar", "write:catalog", "write:ow", "read:py", "read:jar", "read:catalog",
                 "read:ow"):
        assert counts[side] > 0, (side, counts)  # every writer and every reader took part
    assert counts["refused"] > 0 and counts["filters"] > 0 and counts["rows_read"] > 500, counts
