"""The concurrency checker's verdict: what the history says about every read, write and wait.

Reads ``history/*.jsonl`` of a checker run (``checker_clients.py`` writes them, ``checker.py`` adds its
kills and the end-of-run findings) and returns the violations by kind, each with a sentence naming the
read, the write and what was expected and got. Pure analysis: no service, no processes.

The consistency rule checked: a read returns exactly one committed state of the exchange, that is, for
some instant ``t`` inside the read (for a read planned on a sealed exchange: between its start and its
plan), the rows of exactly the writes of the exchange's epoch current at ``t`` that were committed at
``t``, each write whole (every producer, every row, once). Times are the clients' own: a commit counts
as certainly done from its acknowledgement, as possibly done from the moment it was sent, so a write
whose writer was killed between the two may be present (wholly) or absent. Writes of zero rows are
invisible in the data and constrain nothing.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from checker_clients import MAX_ROWS, NUM_SUBPARTITIONS, SCHEMA, wid_text

INF = math.inf
EXAMPLES_KEPT = 200  # sentences kept per violation kind (all are counted)

# the kinds a run can report, in the order the summary prints them
KINDS = (
    "torn_write",                 # a write partly present in a read
    "duplicate_rows",             # a (write, producer, seq) read more than once
    "phantom_rows",               # rows no producer wrote (sequence or producer out of range)
    "unknown_rows",               # rows of a write no writer logged
    "misrouted_rows",             # rows in another subpartition than their key's
    "uncommitted_write_visible",  # rows of a write whose commit was never sent or was refused
    "mixed_epochs",               # rows of a write of another epoch (or exchange) than the read's plan
    "not_a_committed_state",      # whole writes, but no instant had exactly that set committed
    "read_outlived_its_epoch",    # a read returned normally although its exchange was dropped/overwritten meanwhile
    "read_failed_without_cause",  # a read failed with nothing dropped, overwritten or failed before it
    "wait_past_bound",            # a client waited longer than its documented bound (watchdog)
    "late_failure_after_replace",  # a writer learned its exchange was dropped/overwritten late
    "replace_error_unclear",      # ... or by an error that does not name the drop or overwrite
    "undocumented_error",         # a read or write failed with an error class the package does not export
    "hung_at_end",                # a client still running its operation when the run ended
    "client_crashed",             # a client process ended by itself (not killed, not stopped)
    "service_died",
    "leftover_exchanges",
    "leftover_partitions",
    "leftover_connections",
    "leftover_spill_files",
    "leftover_shm",
    "leftover_shm_killed_client",  # an arena of a writer killed before the service took it over
    "leftover_fds",
    "rss_growth",
)
REPLACE_WORDS = ("drop", "overwr", "replaced")
QUOTED = re.compile(r"'[^']*'")


@dataclass
class Write:
    wid: int
    name: str
    mode: str
    ptype: str
    rows: list[int]
    proc: str
    t_begin: float
    epoch: int | None = None
    t_declared: float | None = None
    t_commit_sent: float | None = None
    t_committed: float | None = None
    end: dict | None = None
    failures: list[dict] = field(default_factory=list)
    killed_at: float | None = None

    @property
    def fate(self) -> str:
        """committed (acknowledged) | maybe (sent, outcome unknown) | absent (never sent, or refused)."""
        if self.t_committed is not None:
            return "committed"
        if self.t_commit_sent is None:
            return "absent"
        if self.end is not None and self.end.get("outcome_known"):
            return "absent"
        return "maybe"

    @property
    def sent(self) -> float:
        return self.t_commit_sent if self.fate != "absent" else INF

    @property
    def ack(self) -> float:
        return self.t_committed if self.t_committed is not None else INF

    def failed_before(self, t: float) -> bool:
        """Whether this write had failed, been aborted or lost its writer to kill -9 before ``t``."""
        if any(f["t"] < t for f in self.failures) or (self.killed_at is not None and self.killed_at < t):
            return True
        return self.end is not None and not self.end.get("committed") and self.end["t"] < t

    @property
    def visible(self) -> bool:
        return sum(self.rows) > 0


@dataclass
class Epoch:
    name: str
    epoch: int
    writes: list[Write] = field(default_factory=list)
    created_lo: float = INF  # the declare that made it was sent after this
    created_ack: float = INF  # it existed by then
    end: float = INF  # it was replaced or dropped by then
    end_cause: str = ""


class History:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.records: list[dict] = []
        self.torn_lines = 0
        for path in sorted((workdir / "history").glob("*.jsonl")):
            proc = path.stem
            with open(path, "rb") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        self.torn_lines += 1  # a line cut by kill -9 (a write(2) of one line is whole in practice)
                        continue
                    rec["proc"] = proc
                    self.records.append(rec)
        self.records.sort(key=lambda r: r["t"])
        self.t0 = next((r["t"] for r in self.records if r["ev"] == "run"), self.records[0]["t"] if self.records else 0.0)
        self.writes: dict[int, Write] = {}
        self.drops: list[dict] = []
        self.drop_begins: list[dict] = []  # every drop sent, answered or not (its sender may have been killed)
        self.reads: list[dict] = []
        self.read_begins: dict[tuple[str, int], dict] = {}
        self.stalls: list[dict] = []
        self.kills: dict[str, float] = {}  # proc -> kill time
        self.findings: list[dict] = []  # the orchestrator's own (leaks, crashes, hangs)
        self.run: dict = {}
        self._index()

    def rel(self, t: float | None) -> str:
        return "never" if t is None or t == INF else f"+{t - self.t0:.2f}s"

    def _index(self) -> None:
        drop_begins: dict[tuple[str, int], dict] = {}
        for r in self.records:
            ev = r["ev"]
            if ev == "write_begin":
                self.writes[r["wid"]] = Write(r["wid"], r["name"], r["mode"], r["ptype"], r["rows"], r["proc"], r["t"])
            elif ev in ("declared", "commit_sent", "committed", "write_end", "producer_failed"):
                w = self.writes.get(r["wid"])
                if w is None:
                    continue
                if ev == "declared":
                    w.epoch, w.t_declared = r["epoch"], r["t"]
                elif ev == "commit_sent":
                    w.t_commit_sent = r["t"]
                elif ev == "committed":
                    w.t_committed = r["t"]
                elif ev == "write_end":
                    w.end = r
                    if not r.get("committed") and r.get("error"):
                        w.failures.append(r)
                else:
                    w.failures.append(r)
            elif ev == "drop_begin":
                drop_begins[(r["proc"], r["op"])] = r
                self.drop_begins.append(r)
            elif ev == "drop_end":
                begin = drop_begins.get((r["proc"], r["op"]), r)
                self.drops.append({**r, "t_begin": begin["t"]})
            elif ev == "read_begin":
                self.read_begins[(r["proc"], r["op"])] = r
            elif ev == "read_end":
                self.reads.append(r)
            elif ev == "stall":
                self.stalls.append(r)
            elif ev == "kill":
                self.kills[r["target"]] = r["t"]
            elif ev == "finding":
                self.findings.append(r)
            elif ev == "run":
                self.run = r
        for w in self.writes.values():
            if w.end is None:
                w.killed_at = self.kills.get(w.proc)
        self.epochs: dict[tuple[str, int], Epoch] = {}
        for w in self.writes.values():
            if w.epoch is None:
                continue
            e = self.epochs.setdefault((w.name, w.epoch), Epoch(w.name, w.epoch))
            e.writes.append(w)
            e.created_lo = min(e.created_lo, w.t_begin)
            e.created_ack = min(e.created_ack, w.t_declared)
        for (name, number), e in self.epochs.items():
            # a declare that got a later epoch of the name ended this one, unless that write never committed: a
            # failed overwrite changes nothing (the service restores the version it was to replace)
            for w in self.writes.values():
                if (w.name == name and w.epoch is not None and w.epoch > number and w.t_declared < e.end
                        and w.fate != "absent"):
                    e.end, e.end_cause = w.t_declared, f"{w.mode} {wid_text(w.wid)} got epoch {w.epoch}"
            for d in self.drops:  # a drop sent after the epoch surely existed ended it (or a later one)
                if d["name"] == name and d.get("ok") and d["t_begin"] > e.created_ack and d["t"] < e.end:
                    e.end, e.end_cause = d["t"], f"dropped by {d['proc']} op {d['op']}"


def expected_per_subpartition() -> np.ndarray:
    """[sub, n]: how many of a producer's first n rows (keys 0..n-1) the hash selector sends to sub."""
    from sparkflow_exchange.writer.selectors import make_selector

    keys = np.arange(MAX_ROWS + 1, dtype=np.int64)
    batch = pa.record_batch([pa.array(np.zeros(len(keys), np.int64)), pa.array(np.zeros(len(keys), np.int32)),
                             pa.array(keys), pa.array(keys)], schema=SCHEMA)
    subs = np.asarray(make_selector("hash", NUM_SUBPARTITIONS, 0, SCHEMA, keys=("key",)).select(batch))
    table = np.zeros((NUM_SUBPARTITIONS, MAX_ROWS + 2), np.int64)
    for s in range(NUM_SUBPARTITIONS):
        table[s, 1:] = np.cumsum(subs == s)
    return table


class Verdict:
    def __init__(self, history: History, slack: float = 3.0, replace_bound: float = 2.0) -> None:
        self.h = history
        self.slack = slack
        self.replace_bound = replace_bound
        self.counts: Counter = Counter()
        self.examples: dict[str, list[str]] = defaultdict(list)
        self.stats: dict[str, Any] = {}
        self.expected = expected_per_subpartition()

    def violation(self, kind: str, message: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES_KEPT:
            self.examples[kind].append(message)

    def run(self) -> "Verdict":
        for read in self.h.reads:
            if read.get("ok"):
                self.check_read(read)
            elif read.get("stage") == "read":
                self.check_failed_read(read)
        self.check_waits()
        self.check_error_classes()
        self.check_writers_learn_replacement()
        for f in self.h.findings:
            self.violation(f["kind"], f["message"] + self.partition_story(f["message"]))
        self.collect_stats()
        return self

    # ------------------------------------------------------------ reads
    def describe_read(self, r: dict) -> str:
        return (f"read {r['proc']} op {r['op']} of {r['name']!r} epoch {r['epoch']} ({r['mode']}"
                f"{', ' + r['ptype'] if r.get('ptype') else ''}; began {self.h.rel(r['t_begin'])}, planned "
                f"{self.h.rel(r['t_desc'])}, ended {self.h.rel(r['t'])})")

    def describe_write(self, w: Write) -> str:
        return (f"write {wid_text(w.wid)} ({w.mode} of {w.name!r} epoch {w.epoch}, {w.ptype}, rows per producer "
                f"{w.rows}; commit sent {self.h.rel(w.t_commit_sent)}, acknowledged {self.h.rel(w.t_committed)}, "
                f"fate {w.fate})")

    def check_read(self, r: dict) -> None:
        seen: dict[int, dict[int, dict[int, list[int]]]] = defaultdict(lambda: defaultdict(dict))  # wid->p->sub->g
        for sub, groups in r["subs"].items():
            for wid, producer, count, lo, hi, distinct in groups:
                seen[wid][producer][int(sub)] = [count, lo, hi, distinct]
        if r.get("misrouted"):
            self.violation("misrouted_rows", f"{self.describe_read(r)}: rows in the wrong subpartition: {r['misrouted']}")
        planned = planned_wids(r.get("desc_committed"))
        broken = False
        included: list[Write] = []
        for wid, producers in sorted(seen.items()):
            w = self.h.writes.get(wid)
            if w is None:
                self.violation("unknown_rows", f"{self.describe_read(r)}: rows of write {wid_text(wid)}, which no "
                                               "writer logged")
                broken = True
                continue
            included.append(w)
            if w.name != r["name"] or w.epoch != r["epoch"]:
                self.violation("mixed_epochs", f"{self.describe_read(r)}: rows of {self.describe_write(w)}")
                broken = True
            if w.fate == "absent":
                end = w.end or {}
                why = (f"its commit was refused ({end.get('error_class')}: {end.get('error', '')[:160]})"
                       if w.t_commit_sent is not None else
                       f"its commit was never sent ({'writer killed ' + self.h.rel(w.killed_at) if w.killed_at else end.get('stage', 'no end logged')})")
                self.violation("uncommitted_write_visible", f"{self.describe_read(r)}: rows of "
                                                            f"{self.describe_write(w)}; {why}")
                broken = True
            if self.check_whole(r, w, producers, planned):
                broken = True
        if not broken:
            self.check_state(r, included)
        self.check_outlived(r)

    def check_failed_read(self, r: dict) -> None:
        """A read fails only for a cause: a drop or overwrite of its name sent before it failed, or a full service.

        Without this, a service failing every read would pass: every other check looks at reads that returned.
        """
        if r.get("error_class", "").endswith("ServiceUnavailable"):
            return  # refused for room: a documented way to degrade, counted in the stats
        if r.get("ptype") == "PIPELINED_BOUNDED" and "already consumed" in r.get("error", ""):
            return  # a PIPELINED_BOUNDED subpartition is read once: a second reader is told so
        name, epoch, failed_at = r["name"], r.get("epoch"), r["t"]
        # a write begun before the failure that got a later epoch, or an overwrite whose epoch is unknown
        # (its writer was killed before it logged the declare)
        replacing = [w for w in self.h.writes.values()
                     if w.name == name and w.t_begin < failed_at
                     and (w.epoch > epoch if w.epoch is not None and epoch is not None else w.mode == "overwrite")]
        drops = [d for d in self.h.drop_begins if d["name"] == name and d["t"] < failed_at]
        # a write of the read's own epoch that failed, was aborted or was killed: a pipelined read of it fails
        broken = [w for w in self.h.writes.values()
                  if w.name == name and w.epoch == epoch and w.failed_before(failed_at)]
        if replacing or drops or broken:
            return
        self.violation("read_failed_without_cause",
                       f"{self.describe_read(r)}: failed {self.h.rel(failed_at)} with {r.get('error_class')}: "
                       f"{r.get('error', '')[:200]}; no drop or overwrite of {name!r} had been sent by then")

    def check_outlived(self, r: dict) -> None:
        """A drop or overwrite during a read fails the read (the read's subpartitions still running then)."""
        epoch = self.h.epochs.get((r["name"], r["epoch"]))
        last = r.get("t_last_sub")
        if epoch is None or last is None or epoch.end == INF:
            return
        if epoch.end > r["t_desc"] and last - epoch.end > self.slack:
            self.violation("read_outlived_its_epoch",
                           f"{self.describe_read(r)}: its epoch ended {self.h.rel(epoch.end)} ({epoch.end_cause}), "
                           f"its last subpartition still returned normally {last - epoch.end:.1f} s later")

    def check_whole(self, r: dict, w: Write, producers: dict[int, dict[int, list[int]]], planned: set | None) -> bool:
        """Every producer of ``w``, every row, once; returns whether something was wrong."""
        short: list[str] = []
        wrong = False
        for producer, subs in sorted(producers.items()):
            if producer >= len(w.rows):
                self.violation("phantom_rows", f"{self.describe_read(r)}: rows of producer {producer} of "
                                               f"{self.describe_write(w)}, which has {len(w.rows)} producers")
                wrong = True
                continue
            for sub, (count, lo, hi, distinct) in sorted(subs.items()):
                if count != distinct:
                    self.violation("duplicate_rows", f"{self.describe_read(r)}: {count - distinct} duplicate rows of "
                                                     f"producer {producer} in subpartition {sub} of {self.describe_write(w)}")
                    wrong = True
                if lo < 0 or hi >= w.rows[producer]:
                    self.violation("phantom_rows", f"{self.describe_read(r)}: producer {producer} subpartition {sub} "
                                                   f"has sequence numbers {lo}..{hi}, the producer wrote 0.."
                                                   f"{w.rows[producer] - 1} ({self.describe_write(w)})")
                    wrong = True
        for producer, n in enumerate(w.rows):
            got_total, parts = 0, []
            for sub in range(NUM_SUBPARTITIONS):
                want = int(self.expected[sub, n])
                got = producers.get(producer, {}).get(sub, [0, 0, 0, 0])[3]
                got_total += got
                if got != want:
                    parts.append(f"subpartition {sub}: {got:,} of {want:,}")
            if parts:
                short.append(f"producer {producer}: {got_total:,} of {n:,} rows ({'; '.join(parts)})")
        if short:
            in_plan = "" if planned is None else (" (in the read's plan)" if w.wid in planned else
                                                  " (not in the read's plan)")
            self.violation("torn_write", f"{self.describe_read(r)} got part of {self.describe_write(w)}{in_plan}: "
                                         + "; ".join(short))
            wrong = True
        return wrong

    def check_state(self, r: dict, included: list[Write]) -> None:
        """Is there an instant inside the read at which exactly ``included`` (of the visible writes) was committed?"""
        epoch = self.h.epochs.get((r["name"], r["epoch"]))
        if epoch is None:  # no write of this epoch was logged: the read must be empty
            if included:
                self.violation("not_a_committed_state", f"{self.describe_read(r)}: rows of an epoch no writer declared")
            return
        inside = {w.wid for w in included}
        upper = r["t_desc"] if r["mode"] == "sealed" else r["t"]
        lo_parts = [(r["t_begin"], "the read began"), (epoch.created_lo, "the epoch was declared")]
        lo_parts += [(w.sent, f"the commit of included {wid_text(w.wid)} was sent") for w in included]
        hi_parts = [(upper, "the read was planned" if r["mode"] == "sealed" else "the read ended"),
                    (epoch.end, f"the epoch ended ({epoch.end_cause})")]
        hi_parts += [(w.ack, f"missing {self.describe_write(w)} was acknowledged")
                     for w in epoch.writes if w.visible and w.wid not in inside]
        lo, lo_why = max(lo_parts, key=lambda p: p[0])
        hi, hi_why = min(hi_parts, key=lambda p: p[0])
        if lo > hi:
            self.violation("not_a_committed_state",
                           f"{self.describe_read(r)} read writes {sorted(wid_text(w.wid) for w in included)}: no "
                           f"instant fits, it must be after {self.h.rel(lo)} ({lo_why}) and before "
                           f"{self.h.rel(hi)} ({hi_why})")

    def check_error_classes(self) -> None:
        """Every error a client met is a documented class of the package (one per meaning)."""
        seen: Counter = Counter()
        first: dict[str, str] = {}
        for r in self.h.records:
            if r.get("documented") is False:
                key = f"{r['error_class']}: {re.sub(QUOTED, chr(39) * 2, r['error'][:120])}"  # per message, any name
                seen[key] += 1
                first.setdefault(key, f"{r['proc']} {r['ev']} op {r.get('op')} {self.h.rel(r['t'])}")
        for key, n in seen.most_common():
            self.violation("undocumented_error", f"{n} x {key} (first: {first[key]})")

    # ------------------------------------------------------------ waits
    def check_waits(self) -> None:
        seen: set[tuple] = set()
        for s in self.h.stalls:
            key = (s["proc"], s["op"], s["what"])
            if key in seen:
                continue
            seen.add(key)
            self.violation("wait_past_bound", f"{s['proc']} op {s['op']}: {s['what']} waited {s['waited']:.1f} s at "
                                              f"{self.h.rel(s['t'])}, bound {s['bound']:g} s + slack; at:\n"
                                              + indent(s.get("stack", "")))

    def check_writers_learn_replacement(self) -> None:
        """A writer whose exchange was dropped or overwritten while its producers ran fails within the bound,
        with an error that names the drop or overwrite."""
        for w in self.h.writes.values():
            if w.epoch is None:
                continue
            epoch = self.h.epochs[(w.name, w.epoch)]
            t_r = epoch.end
            if t_r == INF or t_r <= w.t_declared:
                continue
            producers = (w.end or {}).get("producers") or []
            if w.end is not None and producers and all(p.get("ok") and p["t_end"] <= t_r for p in producers):
                continue  # every producer was done before: only the commit could learn, and it answers at once
            if w.end is not None and w.end.get("stage") == "declare":
                continue
            learned = [f for f in w.failures if f["t"] >= t_r - 1e-3]
            if learned:
                first = min(learned, key=lambda f: f["t"])
                late = first["t"] - t_r
                if late > self.replace_bound + self.slack:
                    longest = max((p.get("longest_wait", 0.0) for p in producers), default=None)
                    waited = "" if longest is None else f" (its producers' longest single wait: {longest:.1f} s)"
                    self.violation("late_failure_after_replace",
                                   f"{self.describe_write(w)}: its epoch ended {self.h.rel(t_r)} ({epoch.end_cause}); "
                                   f"the writer failed only {late:.1f} s later{waited}: {first.get('error_class')}: "
                                   f"{first.get('error', '')[:240]}")
                elif not any(word in first.get("error", "").lower() for word in REPLACE_WORDS):
                    self.violation("replace_error_unclear",
                                   f"{self.describe_write(w)}: its epoch ended {self.h.rel(t_r)} ({epoch.end_cause}); "
                                   f"the writer failed with {first.get('error_class')}: {first.get('error', '')[:240]}")
            elif w.end is None:
                stopped = w.killed_at if w.killed_at is not None else INF
                if stopped - t_r > self.replace_bound + self.slack:
                    at = "when it was killed" if w.killed_at is not None else "when the run ended"
                    self.violation("late_failure_after_replace",
                                   f"{self.describe_write(w)}: its epoch ended {self.h.rel(t_r)} ({epoch.end_cause}); "
                                   f"the writer still wrote {stopped - t_r:.1f} s later, {at}" if stopped != INF else
                                   f"{self.describe_write(w)}: its epoch ended {self.h.rel(t_r)} ({epoch.end_cause}); "
                                   "the writer never learned it")
            elif w.fate == "committed" and w.t_committed > t_r:
                self.violation("late_failure_after_replace",
                               f"{self.describe_write(w)}: its commit was acknowledged after its epoch ended "
                               f"{self.h.rel(t_r)} ({epoch.end_cause})")

    def partition_story(self, message: str) -> str:
        """What the history says of the write a leftover partition belongs to (its attempt is the write's id)."""
        found = re.search(r"\.(w\d+\.\d+\.\d+)\.[0-9a-f]+\b", message)
        wids = planned_wids([f"x.0.0.{found.group(1)}.0"]) if found else set()
        w = self.h.writes.get(next(iter(wids))) if wids else None
        if w is None:
            return ""
        if w.killed_at is not None:
            return (f"; {self.describe_write(w)}: its writer was killed -9 {self.h.rel(w.killed_at)}, "
                    f"{w.killed_at - (w.t_declared or w.t_begin):.2f} s after the declare")
        return f"; {self.describe_write(w)}: its writer ended it at stage {(w.end or {}).get('stage')}"

    # ------------------------------------------------------------ numbers
    def collect_stats(self) -> None:
        ok = [r for r in self.h.reads if r.get("ok")]
        failed = [r for r in self.h.reads if not r.get("ok")]
        writes = list(self.h.writes.values())
        fates = Counter(w.fate for w in writes)
        errors = Counter(f"{r.get('stage')}: {r.get('error_class')}" for r in failed)
        write_errors = Counter(f"{(w.end or {}).get('stage', 'killed' if w.killed_at else 'running')}: "
                               f"{(w.failures[0] if w.failures else {}).get('error_class', '-')}"
                               for w in writes if w.fate != "committed")
        kills = Counter(p[:6] for p in self.h.kills)
        self.stats = {
            "reads": len(self.h.reads), "reads_ok": len(ok), "reads_failed": len(failed),
            "reads_ok_sealed": sum(r["mode"] == "sealed" for r in ok),
            "reads_ok_pipelined": sum(r["mode"] == "pipelined" for r in ok),
            "reads_ok_by_type": dict(Counter(r.get("ptype") for r in ok)),
            "rows_read": sum(r.get("rows", 0) for r in ok),
            "read_failures": dict(errors.most_common(12)),
            "writes": len(writes), "writes_committed": fates["committed"], "writes_maybe": fates["maybe"],
            "writes_absent": fates["absent"],
            "rows_committed": sum(sum(w.rows) for w in writes if w.fate == "committed"),
            "write_failures": dict(write_errors.most_common(12)),
            "drops": len(self.h.drops), "drops_ok": sum(bool(d.get("ok")) for d in self.h.drops),
            "kills": dict(kills), "history_lines": len(self.h.records), "torn_history_lines": self.h.torn_lines,
        }

    def summary(self) -> dict:
        return {"stats": self.stats, "violations": {k: self.counts[k] for k in KINDS if self.counts[k]},
                "examples": {k: self.examples[k] for k in KINDS if self.examples[k]}}


def planned_wids(partitions: list[str] | None) -> set[int] | None:
    """The writes of a sealed read's plan, from its partition names (``name.epoch.index.<attempt>.uuid``,
    the attempt being the write's text id)."""
    if partitions is None:
        return None
    out = set()
    for p in partitions:
        parts = p.split(".")
        attempt = ".".join(parts[3:-1])
        try:
            slot, inc, counter = (int(x) for x in attempt.lstrip("w").split("."))
        except ValueError:
            continue
        out.add((slot << 40) | (inc << 24) | counter)
    return out


def indent(text: str) -> str:
    return "\n".join("      " + line for line in text.rstrip().splitlines())


def analyse(workdir: Path, slack: float = 3.0, replace_bound: float = 2.0) -> Verdict:
    return Verdict(History(workdir), slack, replace_bound).run()
