"""``list_exchanges()``: the documented summary of each exchange (not the coordinator's record), and
``sparkflow-exchange list --json`` printing the same, against a real service."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

import sparkflow_exchange as sfe
from sparkflow_exchange import ExchangeKind, ExchangeState, ExchangeSummary, PartitionType

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("a b", pa.string()),
                    pa.field("price", pa.decimal128(5, 2))])


def _settings(svc) -> dict:
    return {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}


def _write(svc, name: str, rows: int, **options) -> None:
    with sfe.open_writer(name, SCHEMA, **options, **_settings(svc)) as w:
        w.write(pa.record_batch([pa.array(range(rows), pa.int64()), pa.array([f"s{i}" for i in range(rows)]),
                                 pa.array([None] * rows, pa.decimal128(5, 2))], schema=SCHEMA))


def test_list_exchanges_returns_a_summary_with_spark_ddl_counts_and_times(tmp_service):
    svc = tmp_service()
    before = datetime.now(timezone.utc).replace(microsecond=0)
    _write(svc, "summed", 1_000, keys=["id"], num_subpartitions=3, partitionType="BLOCKING")
    [summary] = sfe.list_exchanges(**_settings(svc))
    assert isinstance(summary, ExchangeSummary)
    assert (summary.name, summary.kind, summary.state) == ("summed", ExchangeKind.BATCH, ExchangeState.COMMITTED)
    assert summary.schema == "id bigint NOT NULL, `a b` string, price decimal(5,2)"
    assert (summary.partition_type, summary.partitioner, summary.keys) == (PartitionType.BLOCKING, "hash", ("id",))
    assert (summary.num_subpartitions, summary.producers, summary.rows) == (3, 1, 1_000)
    assert summary.bytes > 0 and summary.stream is None and isinstance(summary.owner, str)
    assert before <= summary.created <= summary.last_used <= datetime.now(timezone.utc)
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.rows = 0  # type: ignore[misc]
    # nothing of the coordinator's record leaks: no base64 schema, no producers' locations or spill files
    assert not re.search(r"spill|location|/tmp|base64", repr(summary))


def test_the_cli_lists_the_same_summary(tmp_service, tmp_path):
    svc = tmp_service()
    _write(svc, "listed", 10, partitioner="rebalance", num_subpartitions=2)
    secret_file = tmp_path / "secret"
    secret_file.write_text(svc.secret)
    secret_file.chmod(0o600)
    [summary] = sfe.list_exchanges(**_settings(svc))
    out = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "list", "--json", "--address", svc.tcp,
                          "--secret-file", str(secret_file)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [listed] = json.loads(out.stdout)
    assert listed == summary.to_json()
    assert listed["schema"] == "id bigint NOT NULL, `a b` string, price decimal(5,2)"
    assert (listed["state"], listed["partitioner"], listed["keys"], listed["rows"]) == ("committed", "rebalance", [], 10)
    assert datetime.fromisoformat(listed["created"]) == summary.created
    table = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "list", "--address", svc.tcp,
                            "--secret-file", str(secret_file)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "listed" in table.stdout and "id bigint NOT NULL" in table.stdout, table.stderr


def test_every_field_of_the_summary_is_documented():
    ops = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = ops.split("### What `list_exchanges()` returns", 1)[1].split("\n## ", 1)[0]
    missing = [f.name for f in dataclasses.fields(ExchangeSummary) if f"| `{f.name}` |" not in section]
    missing += [f.name for f in dataclasses.fields(sfe.StreamSummary) if f"`{f.name}`" not in section]
    assert not missing, f"fields of list_exchanges()'s summary missing from docs/operations.md: {missing}"
