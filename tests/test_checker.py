"""The concurrency checker (scripts/checker.py): its verdict on made-up histories, then a short real run.

The made-up histories hold the rows a reader would have summarised (routed by the real hash selector),
so each test shows that one kind of wrong read or wait is found and named, and that a right one is not
flagged. The short run starts a real service with writer and reader processes, kill -9 included.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from checker_clients import NUM_SUBPARTITIONS, SCHEMA, make_wid, summarise, wid_text  # noqa: E402
from checker_verdict import analyse  # noqa: E402

from sparkflow_exchange.writer.selectors import make_selector  # noqa: E402

SELECTOR = make_selector("hash", NUM_SUBPARTITIONS, 0, SCHEMA, keys=("key",))


class Story:
    """A history written as the clients write it, one process file per writer or reader."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        (tmp / "history").mkdir()
        self.files: dict[str, list[dict]] = {"checker": [{"ev": "run", "t": 0.0}]}
        self.ops = 0

    def add(self, proc: str, ev: str, t: float, **fields) -> None:
        self.files.setdefault(proc, []).append({"ev": ev, "t": t, **fields})

    def write(self, slot: int, name: str, epoch: int, rows: list[int], t: tuple[float, ...], mode: str = "overwrite",
              ptype: str = "HYBRID", committed: bool = True, producers_ok: bool = True) -> int:
        """A write that began at t[0], was declared at t[1], sent its commit at t[2] and (if committed) got the
        acknowledgement at t[3]."""
        self.ops += 1
        wid = make_wid(slot, 0, self.ops)
        proc = f"writer{slot:03d}.0000"
        self.add(proc, "write_begin", t[0], op=self.ops, wid=wid, name=name, mode=mode, ptype=ptype, rows=rows)
        self.add(proc, "declared", t[1], op=self.ops, wid=wid, epoch=epoch, write_id="w1")
        if len(t) > 2:
            self.add(proc, "commit_sent", t[2], op=self.ops, wid=wid, partitions=[])
        if committed and len(t) > 3:
            self.add(proc, "committed", t[3], op=self.ops, wid=wid, epoch=epoch, commits=1)
            self.add(proc, "write_end", t[3], op=self.ops, wid=wid, stage="done", committed=True,
                     producers=[{"index": i, "ok": True, "t_end": t[2]} for i in range(len(rows))])
        return wid

    def read(self, slot: int, name: str, epoch: int, t: tuple[float, float, float], parts: list[tuple],
             mode: str = "pipelined", last_sub: float | None = None) -> None:
        """A read that began, was planned and ended at ``t``, and got ``parts``: (wid, producer, seqs)."""
        self.ops += 1
        subs: dict[str, list] = {}
        for s in range(NUM_SUBPARTITIONS):
            columns = []
            for wid, producer, seqs in parts:
                seqs = np.asarray(seqs, np.int64)
                batch = pa.record_batch([pa.array(np.full(len(seqs), wid, np.int64)),
                                         pa.array(np.full(len(seqs), producer, np.int32)), pa.array(seqs),
                                         pa.array(seqs)], schema=SCHEMA)
                mask = np.asarray(SELECTOR.select(batch)) == s
                columns.append((batch.column(0).to_numpy()[mask], batch.column(1).to_numpy()[mask], seqs[mask]))
            subs[str(s)] = summarise(columns)
        proc = f"reader{slot:03d}.0000"
        self.add(proc, "read_begin", t[0], op=self.ops, name=name)
        self.add(proc, "read_end", t[2], op=self.ops, name=name, ok=True, epoch=epoch, mode=mode, t_begin=t[0],
                 t_desc=t[1], ptype="HYBRID", desc_committed=None, subs=subs, misrouted={},
                 rows=sum(len(p[2]) for p in parts), longest_wait=0.1,
                 t_last_sub=t[2] if last_sub is None else last_sub)

    def verdict(self):
        for proc, records in self.files.items():
            with open(self.dir / "history" / f"{proc}.jsonl", "w") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
        return analyse(self.dir)


def whole(wid: int, producer: int, n: int) -> tuple:
    return (wid, producer, np.arange(n))


def test_a_read_of_whole_committed_writes_passes(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000, 500], (1, 1.1, 2, 2.1))
    b = s.write(1, "n0", 1, [7000], (3, 3.1, 4, 4.1), mode="append")
    s.read(0, "n0", 1, (2.5, 2.6, 5.0), [whole(a, 0, 3000), whole(a, 1, 500), whole(b, 0, 7000)])  # b during
    s.read(1, "n0", 1, (2.5, 2.6, 5.0), [whole(a, 0, 3000), whole(a, 1, 500)])  # ... or not yet
    s.read(2, "n0", 1, (5.0, 5.1, 6.0), [whole(a, 0, 3000), whole(a, 1, 500), whole(b, 0, 7000)], mode="sealed")
    v = s.verdict()
    assert v.summary()["violations"] == {}
    assert v.stats["reads_ok"] == 3 and v.stats["rows_read"] == 2 * 3500 + 2 * 7000 + 3500


def test_part_of_an_append_is_a_torn_write_named_with_its_counts(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    b = s.write(1, "n0", 1, [21487], (3, 3.1, 4, 4.1), mode="append")
    s.read(0, "n0", 1, (2.5, 2.6, 5.0), [whole(a, 0, 3000), (b, 0, np.arange(11061))])
    v = s.verdict()
    assert v.counts == {"torn_write": 1}
    message = v.examples["torn_write"][0]
    assert f"part of write {wid_text(b)} (append of 'n0' epoch 1" in message
    assert "producer 0: 11,061 of 21,487 rows" in message and "pipelined" in message


def test_a_missing_producer_is_a_torn_write(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000, 4000], (1, 1.1, 2, 2.1))
    s.read(0, "n0", 1, (3, 3.1, 4), [whole(a, 0, 3000)], mode="sealed")
    v = s.verdict()
    assert v.counts == {"torn_write": 1}
    assert "producer 1: 0 of 4,000 rows" in v.examples["torn_write"][0]


def test_duplicates_are_found(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    s.read(0, "n0", 1, (3, 3.1, 4), [whole(a, 0, 3000), (a, 0, np.arange(10, 20))], mode="sealed")
    v = s.verdict()
    assert set(v.counts) == {"duplicate_rows"}  # one per subpartition that holds some of the repeated rows
    assert sum(int(re.search(r": (\d+) duplicate rows", m).group(1)) for m in v.examples["duplicate_rows"]) == 10


def test_a_write_committed_before_the_read_began_must_be_in_it(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    b = s.write(1, "n0", 1, [500], (2.2, 2.3, 2.4, 2.5), mode="append")
    s.read(0, "n0", 1, (3, 3.1, 4), [whole(a, 0, 3000)], mode="sealed")
    v = s.verdict()
    assert v.counts == {"not_a_committed_state": 1}
    assert f"missing write {wid_text(b)}" in v.examples["not_a_committed_state"][0]


def test_a_write_of_unknown_outcome_may_be_present_or_absent_but_whole(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2))  # commit sent, writer killed before the answer
    s.add("checker", "kill", 2.05, target="writer000.0000", pid=1)
    b = s.write(1, "n0", 1, [500], (3, 3.1, 3.2, 3.3), mode="append")
    s.read(0, "n0", 1, (4, 4.1, 5), [whole(a, 0, 3000), whole(b, 0, 500)], mode="sealed")
    s.read(1, "n0", 1, (4, 4.1, 5), [whole(b, 0, 500)], mode="sealed")
    s.read(2, "n0", 1, (4, 4.1, 5), [(a, 0, np.arange(100)), whole(b, 0, 500)], mode="sealed")
    v = s.verdict()
    assert v.counts == {"torn_write": 1}
    assert v.stats["writes_maybe"] == 1


def test_rows_of_a_write_that_never_committed_are_found(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1))  # declared and written, never committed
    s.read(0, "n0", 1, (4, 4.1, 5), [whole(a, 0, 3000)], mode="pipelined")
    v = s.verdict()
    assert v.counts == {"uncommitted_write_visible": 1}
    assert "its commit was never sent" in v.examples["uncommitted_write_visible"][0]


def test_rows_of_another_epoch_are_mixed_epochs(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    b = s.write(1, "n0", 2, [500], (3, 3.1, 3.2, 3.3))  # an overwrite: epoch 2
    s.read(0, "n0", 2, (4, 4.1, 5), [whole(a, 0, 3000), whole(b, 0, 500)], mode="sealed")
    v = s.verdict()
    assert v.counts == {"mixed_epochs": 1}


def test_an_overwrite_that_never_commits_leaves_the_version_it_was_to_replace(tmp_path):
    """The service restores the version a failed overwrite was to replace: reading it after the failure is a
    committed state; after an overwrite that committed, it is not."""
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    s.write(1, "n0", 2, [500], (3, 3.1))  # an overwrite declared (epoch 2), aborted before its commit
    s.read(0, "n0", 1, (5, 5.1, 6), [whole(a, 0, 3000)], mode="sealed")
    assert s.verdict().summary()["violations"] == {}
    s.write(1, "n1", 2, [500], (7, 7.1, 7.2, 7.3))  # "n1": its epoch 1 written next, then overwritten for good
    b = s.write(0, "n1", 1, [3000], (6.5, 6.6, 6.7, 6.8))
    s.read(1, "n1", 1, (8, 8.1, 9), [whole(b, 0, 3000)], mode="sealed")
    v = s.verdict()
    assert v.counts == {"not_a_committed_state": 1}
    assert "got epoch 2" in v.examples["not_a_committed_state"][0]


def test_a_read_that_returns_long_after_its_exchange_was_dropped_is_named(tmp_path):
    s = Story(tmp_path)
    a = s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    s.add("writer009.0000", "drop_begin", 4.0, op=99, name="n0")
    s.add("writer009.0000", "drop_end", 4.2, op=99, name="n0", ok=True, partitions=1)
    s.read(0, "n0", 1, (3, 3.1, 30), [whole(a, 0, 3000)], mode="sealed", last_sub=29.5)  # read on after the drop
    s.read(1, "n0", 1, (3, 3.1, 30), [whole(a, 0, 3000)], mode="sealed", last_sub=3.9)  # done before it
    v = s.verdict()
    assert v.counts == {"read_outlived_its_epoch": 1}
    assert "reader000.0000" in v.examples["read_outlived_its_epoch"][0]
    assert "dropped by writer009.0000 op 99" in v.examples["read_outlived_its_epoch"][0]


def test_a_read_that_fails_with_nothing_dropped_or_overwritten_is_named(tmp_path):
    s = Story(tmp_path)
    s.write(0, "n0", 1, [3000], (1, 1.1, 2, 2.1))
    s.write(1, "n0", 2, [10], (6, 6.5, 6.6, 6.7))  # an overwrite sent at 6
    plan = {"ok": False, "stage": "read", "epoch": 1, "mode": "sealed", "t_begin": 3.0, "t_desc": 3.1,
            "ptype": "HYBRID", "desc_committed": None, "documented": True,
            "error_class": "sparkflow_exchange.ExchangeReadError", "error": "exchange 'n0' was overwritten"}
    s.add("reader000.0000", "read_end", 5.0, op=1, name="n0", **plan)  # failed before the overwrite was sent
    s.add("reader001.0000", "read_end", 7.0, op=1, name="n0", **plan)  # after: explained
    s.add("reader002.0000", "read_end", 4.0, op=1, name="n0",
          **{**plan, "error_class": "sparkflow_exchange.ServiceUnavailable", "error": "no room"})  # refused: allowed
    s.add("reader003.0000", "read_end", 4.0, op=1, name="n0",
          **{**plan, "ptype": "PIPELINED_BOUNDED", "error": "subpartition 1 was already consumed"})  # read once
    v = s.verdict()
    assert v.counts == {"read_failed_without_cause": 1}
    assert "reader000.0000" in v.examples["read_failed_without_cause"][0]
    s.add("dropper", "drop_begin", 4.5, op=3, name="n0")  # a drop sent before it (its answer never logged)
    assert s.verdict().counts == {}


def test_errors_of_classes_the_package_does_not_export_are_counted_by_class(tmp_path):
    s = Story(tmp_path)
    s.add("dropper", "drop_begin", 0.5, op=1, name="n0")  # the reads failed for a cause, with the wrong class
    for op in range(3):
        s.add("reader000.0000", "read_end", 1.0 + op, op=op, name="n0", ok=False, stage="read",
              error_class="sparkflow_exchange.network.blocking_client.ServiceError", error="exchange 'n0' does not exist",
              documented=False)
    s.add("reader001.0000", "read_end", 2.0, op=9, name="n0", ok=False, stage="read",
          error_class="sparkflow_exchange.ExchangeReadError", error="exchange 'n0' was dropped", documented=True)
    v = s.verdict()
    assert v.counts == {"undocumented_error": 1}
    assert v.examples["undocumented_error"][0].startswith("3 x sparkflow_exchange.network.blocking_client.ServiceError")


def test_a_writer_that_learns_of_an_overwrite_late_or_vaguely_is_named(tmp_path):
    s = Story(tmp_path)
    slow = s.write(0, "n0", 1, [30000], (1, 1.1))
    vague = s.write(1, "n0", 1, [30000], (1, 1.1), mode="append")
    prompt = s.write(2, "n0", 1, [30000], (1, 1.1), mode="append")
    s.write(3, "n0", 2, [10], (2, 2.5, 2.6, 2.7))  # the overwrite: epoch 1 ended at 2.5
    for wid, slot, t, error in ((slow, 0, 20.0, "partition has been full for 15 s: no consumer"),
                                (vague, 1, 3.0, "does not accept buffers any more"),
                                (prompt, 2, 3.0, "exchange 'n0' was replaced by an overwrite")):
        s.add(f"writer{slot:03d}.0000", "write_end", t, op=0, wid=wid, stage="produce", committed=False, aborted=True,
              error_class="X", error=error, producers=[{"index": 0, "ok": False, "t_end": t}])
    v = s.verdict()
    assert v.counts == {"late_failure_after_replace": 1, "replace_error_unclear": 1}
    assert wid_text(slow) in v.examples["late_failure_after_replace"][0]
    assert "17.5 s later" in v.examples["late_failure_after_replace"][0]
    assert wid_text(vague) in v.examples["replace_error_unclear"][0]


def test_short_run_against_a_real_service(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "checker.py"), "--duration", "20", "--min-reads", "4",
         "--max-duration", "300", "--writers", "3", "--readers", "3", "--kill-every", "8", "--seed", "7",
         "--names", "4", "--slack", "20", "--workdir", str(tmp_path / "run"), "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    stats = summary["stats"]
    assert stats["reads_ok"] > 0 and stats["writes_committed"] > 0 and sum(stats["kills"].values()) > 0, stats
    assert stats["service_private_bound_mib"] > 0, stats  # the service's memory was measured against its bound
    violations = summary["violations"]
    assert violations == {}, "\n".join(f"{k}: {e}" for k in violations for e in summary["examples"][k][:3])


def test_short_run_with_readers_through_the_jvm_reader(tmp_path, jar):
    """Two of the four readers read through the plugin jar's JVM reader (sealed and while written): every read
    it returned is one committed state, and it fails only as the package's reads fail (a drop or overwrite
    named as such)."""
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "checker.py"), "--duration", "20", "--min-reads", "6",
         "--min-jvm-reads", "2", "--max-duration", "300", "--writers", "3", "--readers", "4", "--jvm-readers", "2", "--kill-every", "10",
         "--seed", "11", "--names", "8", "--slack", "20", "--workdir", str(tmp_path / "run"), "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    violations = summary["violations"]
    assert violations == {}, "\n".join(f"{k}: {e}" for k in violations for e in summary["examples"][k][:3])
    jvm_reads: dict[bool, int] = {True: 0, False: 0}
    for history in (tmp_path / "run" / "history").glob("reader*.jsonl"):
        events = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
        if any(e["ev"] == "jvm_reader" for e in events):
            for e in events:
                if e["ev"] == "read_end":
                    jvm_reads[e["ok"]] += 1
    assert jvm_reads[True] > 0, jvm_reads  # the JVM reader returned reads, and each passed the verdict
