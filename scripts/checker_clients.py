"""The concurrency checker's client processes: writers and readers of one standalone service.

Started by ``scripts/checker.py`` (one process per slot, restarted after each kill -9); not run by hand.
They use the client API the Spark tasks use (``sparkflow_exchange.exchange``) and write what they
intend, what the service acknowledged and what they read to an append-only JSON-lines history,
one file per process: each line is written with one ``write`` on an ``O_APPEND`` descriptor, so a
kill -9 loses at most the operation in flight, never a line already written.

Every row carries its write (``wid``), its producer and its sequence number within that producer;
a reader records, per subpartition and per (write, producer), how many rows it got, the smallest and
largest sequence number and how many distinct ones, so the verdict (``checker_verdict.py``) can tell a
whole write from a torn one and find duplicates without keeping the rows.

A watchdog thread in each process looks at every running wait once a second: a wait longer than its
documented bound is logged at once (``stall``) with the stack of the thread that waits, so a hang is
reported with its place even when the process is killed afterwards.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

import sparkflow_exchange
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.calls import call
from sparkflow_exchange.config import ExchangeConfig
from sparkflow_exchange.description import ExchangeDescription
from sparkflow_exchange.writer.selectors import make_selector

SCHEMA = pa.schema([pa.field("wid", pa.int64(), nullable=False), pa.field("producer", pa.int32(), nullable=False),
                    pa.field("seq", pa.int64(), nullable=False), pa.field("key", pa.int64(), nullable=False)])
NUM_SUBPARTITIONS = 4
MAX_ROWS = 40_000  # rows per producer: 0..MAX_ROWS
MAX_PRODUCERS = 3  # producers of a write: 1..MAX_PRODUCERS, each a thread with a connection of its own
PARTITION_TYPES = ("HYBRID", "BLOCKING", "PIPELINED_BOUNDED")
# errors after which a commit may or may not have happened (the request may have reached the service)
UNCERTAIN = re.compile(r"ServiceError|Timeout|Connection|Unavailable|Unreachable|OSError|timed out|connection|"
                       r"cannot reach|closed", re.IGNORECASE)
OVERWRITE_SHARE = 0.7
DROP_SHARE = 0.08


def make_wid(slot: int, incarnation: int, counter: int) -> int:
    """A write's id, unique over the run: the writer's slot, its incarnation (restarts) and a counter."""
    return (slot << 40) | (incarnation << 24) | counter


def wid_text(wid: int) -> str:
    return f"w{wid >> 40}.{(wid >> 24) & 0xFFFF}.{wid & 0xFFFFFF}"


def error_record(exc: BaseException) -> dict:
    """The error as history; ``documented``: a class the package exports (``sparkflow_exchange.__all__``)."""
    cls = type(exc)
    documented = cls.__name__ in getattr(sparkflow_exchange, "__all__", ()) \
        and getattr(sparkflow_exchange, cls.__name__, None) is cls
    return {"error_class": f"{cls.__module__}.{cls.__qualname__}", "error": str(exc)[:600], "documented": documented}


class HistoryFile:
    """This process's history file: one JSON object per line, each written whole by one system call."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.lock = threading.Lock()

    def log(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "t": time.monotonic(), **fields}, separators=(",", ":")) + "\n"
        with self.lock:
            os.write(self.fd, line.encode())


@dataclass
class Wait:
    """One thread's current wait: what it waits for, since when, and how long it may wait."""

    op: int
    what: str
    bound: float
    thread: int = field(default_factory=threading.get_ident)
    since: float = field(default_factory=time.monotonic)
    longest: float = 0.0
    reported: bool = False

    def tick(self, what: str | None = None, bound: float | None = None) -> None:
        """Progress: the wait so far ends here; the next one starts (with a new meaning, if given)."""
        now = time.monotonic()
        self.longest = max(self.longest, now - self.since)
        self.since = now
        self.reported = False
        if what is not None:
            self.what = what
        if bound is not None:
            self.bound = bound


class Watchdog(threading.Thread):
    """Logs every wait that outlives its bound (plus the run's slack), with the waiting thread's stack."""

    def __init__(self, history: HistoryFile, slack: float) -> None:
        super().__init__(daemon=True, name="watchdog")
        self.history = history
        self.slack = slack
        self.waits: dict[int, Wait] = {}
        self.lock = threading.Lock()

    def watch(self, op: int, what: str, bound: float) -> Wait:
        wait = Wait(op, what, bound)
        with self.lock:
            self.waits[id(wait)] = wait
        return wait

    def done(self, wait: Wait) -> float:
        wait.tick()
        with self.lock:
            self.waits.pop(id(wait), None)
        return wait.longest

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            with self.lock:
                late = [w for w in self.waits.values() if not w.reported and now - w.since > w.bound + self.slack]
            for wait in late:
                wait.reported = True
                frame = sys._current_frames().get(wait.thread)
                stack = traceback.format_stack(frame)[-8:] if frame is not None else []
                self.history.log("stall", op=wait.op, what=wait.what, waited=round(now - wait.since, 2),
                                 bound=wait.bound, stack="".join(stack)[-3000:])


def warm_up() -> None:
    """Pay the imports and first calls of the data path before the first operation: fifty processes start
    at once on a loaded machine, and a wait's bound is about the service, not the client's own start."""
    from sparkflow_exchange.buffer import BatchEncoder, decode

    seq = np.arange(100, dtype=np.int64)
    batch = pa.record_batch([pa.array(seq), pa.array(seq.astype(np.int32)), pa.array(seq), pa.array(seq)], schema=SCHEMA)
    decode(BatchEncoder(SCHEMA, "none").encode(batch), SCHEMA)
    make_selector("hash", NUM_SUBPARTITIONS, 0, SCHEMA, keys=("key",)).select(batch)
    summarise([(batch.column(0).to_numpy(), batch.column(1).to_numpy(), batch.column(2).to_numpy())])


class Client:
    """What writers and readers share: settings, history, watchdog, the stop file."""

    def __init__(self, args: argparse.Namespace) -> None:
        warm_up()
        self.settings = json.loads(Path(args.settings).read_text())
        self.role = args.role
        self.slot = args.slot
        self.incarnation = args.incarnation
        workdir = Path(self.settings["workdir"])
        self.stop_file = workdir / "stop"
        self.history = HistoryFile(workdir / "history" / f"{self.role}{self.slot:03d}.{self.incarnation:04d}.jsonl")
        self.rng = random.Random(self.settings["seed"] * 1_000_003 + self.slot * 10_007 + self.incarnation
                                 + (0 if self.role == "writer" else 500_009))
        self.unix = self.slot % 2 == 0  # even slots on the Unix socket, odd ones over TCP
        self.timeouts = self.settings["timeouts"]
        self.watchdog = Watchdog(self.history, self.settings["slack"])
        self.ops = 0
        address = self.settings["unix"] if self.unix else self.settings["tcp"]
        # TCP clients claim another host: their reads take remote channels, not the local shortcuts
        host_id = self.settings["host_id"] if self.unix else "checker-remote-client"
        self.base = {"coordinator": address, "service": address, "secret": self.settings["secret"],
                     "hostId": host_id, "partitioner": "hash", "keys": "key",
                     "numSubpartitions": str(NUM_SUBPARTITIONS), **self.settings["client_options"]}

    def config(self, name: str, **extra: str) -> ExchangeConfig:
        return ExchangeConfig.load({**self.base, "exchange": name, **extra}, spark_conf={})

    def run(self) -> None:
        self.history.log("start", role=self.role, slot=self.slot, inc=self.incarnation, pid=os.getpid(),
                         transport="unix" if self.unix else "tcp")
        self.watchdog.start()
        while not self.stop_file.exists():
            self.ops += 1
            self.one_op(self.ops)
        self.history.log("exit", ops=self.ops)

    def one_op(self, op: int) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------- writers
class Writer(Client):
    def one_op(self, op: int) -> None:
        rng = self.rng
        name = rng.choice(self.settings["names"])
        if rng.random() < DROP_SHARE:
            self.drop(op, name)
        else:
            self.write(op, name)
        time.sleep(rng.uniform(0, self.settings["pause"]))

    def drop(self, op: int, name: str) -> None:
        self.history.log("drop_begin", op=op, name=name)
        wait = self.watchdog.watch(op, "drop", self.timeouts["rpc"])
        try:
            result = ex.drop_exchange(name, self.config(name))
            self.history.log("drop_end", op=op, name=name, ok=True, partitions=result.get("partitions"))
        except Exception as exc:  # noqa: BLE001 - every outcome is history
            self.history.log("drop_end", op=op, name=name, ok=False, **error_record(exc))
        finally:
            self.watchdog.done(wait)

    def write(self, op: int, name: str) -> None:
        rng = self.rng
        wid = make_wid(self.slot, self.incarnation, op)
        overwrite = rng.random() < OVERWRITE_SHARE
        ptype = rng.choice(PARTITION_TYPES)
        if not overwrite:  # an append keeps the exchange's partition type (another one is refused)
            try:
                ptype = call(self.config(name), "get_exchange", name=name, wait=0)["partition_type"]
            except Exception:  # noqa: BLE001 - no such exchange: the append creates it
                pass
        rows = [rng.randint(0, MAX_ROWS) for _ in range(rng.randint(1, MAX_PRODUCERS))]
        self.history.log("write_begin", op=op, wid=wid, name=name, mode="overwrite" if overwrite else "append",
                         ptype=ptype, rows=rows)
        cfg = self.config(name, partitionType=ptype)
        wait = self.watchdog.watch(op, "declare", self.timeouts["rpc"])
        try:
            handle = ex.declare_write(cfg, SCHEMA, overwrite)
        except Exception as exc:  # noqa: BLE001
            self.watchdog.done(wait)
            self.history.log("write_end", op=op, wid=wid, stage="declare", committed=False, **error_record(exc))
            return
        self.watchdog.done(wait)
        self.history.log("declared", op=op, wid=wid, epoch=handle.epoch, write_id=handle.write_id)
        results: dict[int, dict] = {}
        threads = [threading.Thread(target=self.produce, args=(op, wid, handle, i, n, results), daemon=True)
                   for i, n in enumerate(rows)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [r for r in results.values() if not r.get("ok")]
        if failed or len(results) != len(rows):
            reason = failed[0].get("error", "a producer failed") if failed else "a producer did not finish"
            wait = self.watchdog.watch(op, "abort", self.timeouts["rpc"])
            try:
                wh.abort_write(handle, reason[:200])
            except Exception as exc:  # noqa: BLE001 - the abort's own failure is history too
                self.history.log("abort_failed", op=op, wid=wid, **error_record(exc))
            self.watchdog.done(wait)
            self.history.log("write_end", op=op, wid=wid, stage="produce", committed=False, aborted=True,
                             producers=list(results.values()))
            return
        partitions = [results[i]["partition"] for i in range(len(rows))]
        self.history.log("commit_sent", op=op, wid=wid, partitions=partitions)
        wait = self.watchdog.watch(op, "commit", self.timeouts["rpc"])
        try:
            desc = wh.commit_write(handle, partitions, {results[i]["partition"]: rows[i] for i in range(len(rows))})
        except Exception as exc:  # noqa: BLE001
            self.watchdog.done(wait)
            record = error_record(exc)
            # a refusal from the service: certainly not committed; a lost connection or a timeout: unknown
            certain = not UNCERTAIN.search(f"{record['error_class']} {record['error']}")
            self.history.log("write_end", op=op, wid=wid, stage="commit", committed=False,
                             outcome_known=certain, producers=list(results.values()), **record)
            return
        self.watchdog.done(wait)
        self.history.log("committed", op=op, wid=wid, epoch=desc.get("epoch"), commits=len(desc.get("committed", ())))
        self.history.log("write_end", op=op, wid=wid, stage="done", committed=True, producers=list(results.values()))

    def produce(self, op: int, wid: int, handle: wh.WriteHandle, index: int, rows: int, results: dict) -> None:
        started = time.monotonic()
        record: dict[str, Any] = {"index": index, "rows": rows, "t_start": started}
        wait = self.watchdog.watch(op, f"producer {index}: register", self.timeouts["rpc"])
        task = None
        try:
            task = ex.ProducerTask(handle, index, wid_text(wid))
            record["partition"] = task.partition
            wait.tick(f"producer {index}: push", self.timeouts["push"])
            task.write(self.batches(wid, index, rows, wait))
            wait.tick(f"producer {index}: finish", self.timeouts["rpc"])
            task.finish()
            record["ok"] = True
        except Exception as exc:  # noqa: BLE001
            record.update(ok=False, t_failed=time.monotonic(), **error_record(exc))
            self.history.log("producer_failed", op=op, wid=wid, index=index, **error_record(exc))
            if task is not None:
                wait.tick(f"producer {index}: fail", self.timeouts["rpc"])
                task.fail(f"{type(exc).__name__}: {exc}")
        finally:
            record["longest_wait"] = round(self.watchdog.done(wait), 3)
            record["t_end"] = time.monotonic()
            results[index] = record

    def batches(self, wid: int, producer: int, rows: int, wait: Wait) -> Iterator[pa.RecordBatch]:
        """The producer's rows in batches of 1,000-8,000; each batch asked for is progress."""
        start = 0
        while start < rows:
            n = min(rows - start, self.rng.randint(1_000, 8_000))
            seq = np.arange(start, start + n, dtype=np.int64)
            wait.tick()
            yield pa.record_batch([pa.array(np.full(n, wid, np.int64)), pa.array(np.full(n, producer, np.int32)),
                                   pa.array(seq), pa.array(seq)], schema=SCHEMA)
            start += n


# ---------------------------------------------------------------- readers
class JvmReader:
    """The plugin jar's JVM reader in a JVM of this process (py4j, no SparkContext): a subpartition read exactly
    as a Spark read task of a scan planned on the same description reads it."""

    COLUMNS = (0, 1, 2)  # wid, producer, seq

    def __init__(self) -> None:
        from pyspark import SparkConf
        from pyspark.java_gateway import launch_gateway

        self.gateway = launch_gateway(SparkConf().set("spark.driver.extraClassPath", sparkflow_exchange.plugin_jar()))
        self.tool = self.gateway.jvm.org.sparkflow.exchange.read.StandaloneRead

    def read(self, desc: ExchangeDescription, subs: list[int], coordinator: str, secret: str,
             host_id: str) -> np.ndarray:
        """(wid, producer, seq) of every row of the read partition of subpartitions ``subs`` (all at once, as a
        read task laid out to fewer partitions than subpartitions reads them); the JVM's ExchangeReadException as
        the package's ExchangeReadError."""
        from py4j.protocol import Py4JJavaError

        columns = self.gateway.new_array(self.gateway.jvm.int, len(self.COLUMNS))
        for i, c in enumerate(self.COLUMNS):
            columns[i] = c
        which = self.gateway.new_array(self.gateway.jvm.int, len(subs))
        for i, sub in enumerate(subs):
            which[i] = sub
        try:
            wire = dataclasses.asdict(desc)  # the coordinator's description as sent (same field names)
            data = self.tool.read(json.dumps(wire), which, coordinator, secret, host_id, columns)
        except Py4JJavaError as exc:
            error = exc.java_exception
            if error.getClass().getName() == "org.sparkflow.exchange.read.ExchangeReadException":
                raise sparkflow_exchange.ExchangeReadError(str(error.getMessage())) from None
            raise
        return np.frombuffer(data, "<i8").reshape(-1, len(self.COLUMNS))


class Reader(Client):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.jvm = JvmReader() if self.slot < self.settings.get("jvm_readers", 0) else None

    def run(self) -> None:
        if self.jvm is not None:
            self.history.log("jvm_reader", pid=self.jvm.gateway.proc.pid if getattr(self.jvm.gateway, "proc", None)
                             else None)
        super().run()

    def one_op(self, op: int) -> None:
        name = self.rng.choice(self.settings["names"])
        self.read(op, name)
        time.sleep(self.rng.uniform(0, self.settings["pause"]))

    def read(self, op: int, name: str) -> None:
        cfg = self.config(name)
        self.history.log("read_begin", op=op, name=name)
        t_begin = time.monotonic()
        wait = self.watchdog.watch(op, "describe", self.timeouts["describe"])
        try:
            desc = ex.describe_exchange(cfg)
        except Exception as exc:  # noqa: BLE001
            self.watchdog.done(wait)
            self.history.log("read_end", op=op, name=name, ok=False, stage="describe", t_begin=t_begin,
                             **error_record(exc))
            return
        self.watchdog.done(wait)
        t_desc = time.monotonic()
        mode = "sealed" if desc.sealed else "pipelined"
        plan = {"epoch": desc.epoch, "mode": mode, "t_begin": t_begin, "t_desc": t_desc,
                "ptype": str(desc.partition_type), "desc_committed": list(desc.committed) if mode == "sealed" else None}
        n = desc.num_subpartitions or NUM_SUBPARTITIONS
        # the read's layout: m read partitions (a divisor of n), partition j reading subpartitions j, j + m, ...
        # all at once, as a read laid out to the task slots does; m = n is one subpartition per task
        m = self.rng.choice([d for d in range(1, n + 1) if n % d == 0] + [n])
        plan["layout"] = m
        outcomes: dict[int, dict] = {}
        # read tasks start when the scheduler gets to them, not all at once
        delays = [self.rng.uniform(0, self.settings["stagger"]) for _ in range(m)]
        threads = [threading.Thread(target=self.read_group, args=(op, cfg, desc, j, m, outcomes, delays[j]),
                                    daemon=True) for j in range(m)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [o for o in outcomes.values() if not o["ok"]]
        if failed or len(outcomes) != n:
            first = failed[0] if failed else {"error_class": "checker", "error": "a subpartition's read did not end"}
            self.history.log("read_end", op=op, name=name, ok=False, stage="read", **plan,
                             error_class=first["error_class"], error=first["error"],
                             documented=first.get("documented", True),
                             failed_subs=[s for s, o in outcomes.items() if not o["ok"]])
            return
        self.history.log("read_end", op=op, name=name, ok=True, **plan,
                         subs={str(s): outcomes[s]["groups"] for s in range(n)},
                         misrouted={str(s): outcomes[s]["misrouted"] for s in range(n) if outcomes[s]["misrouted"]},
                         rows=sum(o["rows"] for o in outcomes.values()),
                         t_last_sub=max(o["t_end"] for o in outcomes.values()),
                         longest_wait=max(o["longest_wait"] for o in outcomes.values()))

    def read_group(self, op: int, cfg: ExchangeConfig, desc: ExchangeDescription, j: int, m: int, outcomes: dict,
                   delay: float) -> None:
        """Read partition ``j`` of ``m`` (subpartitions j, j + m, ...), as one Spark read task would read it; what
        arrived, summarised per subpartition (each row's subpartition recomputed from its key)."""
        time.sleep(delay)
        n = desc.num_subpartitions or NUM_SUBPARTITIONS
        subs = list(range(j, n, m))
        what = f"subpartition {j}" if m == n else f"read partition {j} of {m}"
        wait = self.watchdog.watch(op, f"{what}: first data", self.timeouts["first_data"])
        selector = make_selector("hash", n, 0, SCHEMA, keys=("key",))
        columns: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # wid, producer, seq, target
        try:
            if self.jvm is not None:
                rows = self.jvm.read(desc, subs, self.base["coordinator"], self.base["secret"], self.base["hostId"])
                wait.tick(f"{what}: next data", self.timeouts["next_data"])
                wid, producer, seq = (np.ascontiguousarray(rows[:, i]) for i in range(3))
                batch = pa.record_batch([pa.array(wid), pa.array(producer.astype(np.int32)), pa.array(seq),
                                         pa.array(seq)], schema=SCHEMA)
                columns.append((wid, producer.astype(np.int32), seq, np.asarray(selector.select(batch))))
            batches = () if self.jvm is not None else (
                ex.read_subpartition(cfg, desc, j) if m == n else ex.read_subpartition(cfg, desc, j, stride=m))
            for batch in batches:
                wait.tick(f"{what}: next data", self.timeouts["next_data"])
                columns.append((batch.column(0).to_numpy(), batch.column(1).to_numpy(), batch.column(2).to_numpy(),
                                np.asarray(selector.select(batch))))
        except Exception as exc:  # noqa: BLE001
            for sub in subs:
                outcomes[sub] = {"ok": False, **error_record(exc)}
            return
        finally:
            longest = self.watchdog.done(wait)
        target = np.concatenate([c[3] for c in columns]) if columns else np.zeros(0, np.int64)
        misrouted = int((~np.isin(target, subs)).sum())  # rows of a subpartition this partition does not read
        t_end = time.monotonic()
        for k, sub in enumerate(subs):
            mine = [(c[0][c[3] == sub], c[1][c[3] == sub], c[2][c[3] == sub]) for c in columns]
            groups = summarise(mine)
            outcomes[sub] = {"ok": True, "groups": groups, "misrouted": misrouted if k == 0 else 0,
                             "longest_wait": round(longest, 3), "rows": sum(g[2] for g in groups), "t_end": t_end}


def summarise(columns: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> list[list[int]]:
    """Per (write, producer): [wid, producer, rows, min seq, max seq, distinct seqs] (NumPy, no per-row Python)."""
    if not columns:
        return []
    wid = np.concatenate([c[0] for c in columns])
    producer = np.concatenate([c[1] for c in columns]).astype(np.int64)
    seq = np.concatenate([c[2] for c in columns])
    if not len(seq):
        return []
    order = np.lexsort((seq, producer, wid))
    wid, producer, seq = wid[order], producer[order], seq[order]
    new_group = np.ones(len(seq), bool)
    new_group[1:] = (wid[1:] != wid[:-1]) | (producer[1:] != producer[:-1])
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:], len(seq))
    repeated = np.zeros(len(seq), np.int64)
    repeated[1:] = (~new_group[1:]) & (seq[1:] == seq[:-1])
    repeats = np.add.reduceat(repeated, starts)
    return [[int(wid[s]), int(producer[s]), int(e - s), int(seq[s]), int(seq[e - 1]), int(e - s - r)]
            for s, e, r in zip(starts, ends, repeats)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("writer", "reader"))
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--incarnation", type=int, required=True)
    parser.add_argument("--settings", required=True)
    args = parser.parse_args(argv)
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the checker asks a hung client where it is
    (Writer if args.role == "writer" else Reader)(args).run()


if __name__ == "__main__":
    main()
