"""Metadata at scale: 2,000 producers x 2,000 subpartitions declared, registered, finished with their sizes,
committed, described and listed by a real service, with a subscriber watching (no data moves)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_metadata", Path(__file__).parent.parent / "benchmarks" / "metadata.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PRODUCERS = SUBPARTITIONS = 2000


def test_two_thousand_producers_by_two_thousand_subpartitions(tmp_service):
    svc = tmp_service(host_id="hostA", conf=bench.QUIET_HOST)
    result = bench.run(svc, PRODUCERS, SUBPARTITIONS, name="scale")
    total = sum(result["times"].values())
    print(f"\n2000 x 2000 metadata: {total:.2f} s ({', '.join(f'{k} {v:.2f}' for k, v in result['times'].items())}); "
          f"notifications {result['notifications']} / {result['notification_bytes'] / 1e6:.1f} MB")
    desc = result["described"]
    assert desc["sealed"] and desc["coalesce"] and desc["num_subpartitions"] == SUBPARTITIONS
    assert len(desc["producers"]) == len(desc["committed"]) == PRODUCERS
    assert all(p["state"] == "finished" for p in desc["producers"])
    assert desc["subpartition_bytes"] == result["expected_bytes"]  # summed over every committed producer
    listed = [e for e in result["status"]["exchanges"] if e["name"] == "scale"]
    assert len(listed) == 1 and len(listed[0]["producers"]) == PRODUCERS
    # one subscriber got the full state, then one small delta per change: linear, not producers squared
    assert result["notifications"] == 1 + 2 * PRODUCERS + 1  # the state at subscribe, register + finish each, commit
    assert result["notification_bytes"] < 2000 * PRODUCERS
    assert total < 60, "hang guard; the target (10 s) is measured by benchmarks/metadata.py"
