"""A randomized concurrency checker, in the spirit of Jepsen, against one real standalone service.

    .venv/bin/python scripts/checker.py --duration 600 --writers 25 --readers 25 --kill-every 8 --seed 1

Starts a service (``python -m sparkflow_exchange.service``, as ``sparkflow-exchange serve``), then N
writer and M reader processes (``checker_clients.py``; even slots on the Unix socket, odd ones over TCP)
over a few exchange names. Writers overwrite (70 %) or append, HYBRID / BLOCKING / PIPELINED_BOUNDED,
1-3 producers of 0-40,000 rows each, and drop a name 8 % of the time; readers describe a name and read
all its subpartitions at once (pipelined when the exchange is still written, else from the sealed
plan; ``--jvm-readers`` of them through the plugin jar's JVM reader, in a JVM of their own, as a Spark
read task reads). Every ``--kill-every`` seconds (on average) a random client gets kill -9 and a fresh one takes
its slot. Every row carries its write, producer and sequence number; every process logs what it
intended, what was acknowledged and what it read (``WORKDIR/history``).

When the time is up the clients finish their operation and exit, every name is dropped, and the
service must hold nothing any more: no exchange, partition, connection, spill file, shared-memory
arena, extra file descriptor, nor more memory of its own than the run's configuration lets it keep (see
``memory_bound``). Then ``checker_verdict.py``
checks every read (one committed state, whole writes, no duplicate), every wait (within its documented
bound) and every writer whose exchange was dropped or overwritten (it learned so at once). Prints a
summary (``--json FILE`` writes it as JSON) and exits 1 on any violation.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from checker_clients import MAX_PRODUCERS, NUM_SUBPARTITIONS  # noqa: E402
from checker_verdict import KINDS, analyse  # noqa: E402

import sparkflow_exchange  # noqa: E402
from sparkflow_exchange.config import ExchangeConfig  # noqa: E402
from sparkflow_exchange.errors import ExchangeNotFound  # noqa: E402
from sparkflow_exchange.exchange import drop_exchange  # noqa: E402
from sparkflow_exchange.network.protocol import FrameDecoder  # noqa: E402
from sparkflow_exchange.service.process import RunningService, start_service  # noqa: E402

# the service: a small memory budget, so pools fill and writers meet backpressure and spilling
SERVICE_CONF = {"memory.budget": "64m"}
# the clients' settings (documented keys); the bounds the watchdog holds them to follow from these
CLIENT_OPTIONS = {"bufferSize": "32k", "buffersPerPartition": "8", "bufferTimeout": "50ms",
                  "declareTimeout": "5s", "producerTimeout": "20s", "readerTimeout": "30s",
                  "pipelined.noConsumerTimeout": "15s"}
RPC_TIMEOUT = 30.0  # a client's connection and request timeout (discovery.Endpoints.connect)
# what the service's own memory may grow by besides buffers and connections: modules it imports on first use
# (spilling, compression, ...), their caches, the allocator's fragments (measured: 10-11 MiB on 2 loaded cores)
INTERPRETER_GROWTH = 16 << 20


def bounds() -> dict[str, float]:
    """How long each wait of a client may last, by the documented settings above."""
    cfg = ExchangeConfig.load(dict(CLIENT_OPTIONS), spark_conf={})
    return {"rpc": RPC_TIMEOUT, "describe": cfg.declare_timeout + RPC_TIMEOUT,
            # the pushes of one batch: a credit wait (noConsumerTimeout) and a send (the socket's timeout)
            "push": cfg.no_consumer_timeout + RPC_TIMEOUT, "first_data": cfg.declare_timeout + RPC_TIMEOUT + cfg.reader_timeout,
            "next_data": cfg.reader_timeout}


def private_bytes(pid: int) -> int:
    """A process's own resident memory: anonymous (heap, buffers) and the shared memory it maps (the writers'
    arenas). Not its file pages: the shared libraries' pages it maps are resident as they are faulted in, and what
    the page cache holds (other processes' work) decides that as much as the code it runs (measured: pyarrow's
    libraries took the service's VmRSS 50 MiB up, the same with or without a leak)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssShmem"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["RssAnon"] + fields.get("RssShmem", 0)


def memory_bound(status: dict, clients: int) -> dict[str, int]:
    """What the service's own memory may have grown by at the end of a run, every exchange dropped and every client
    gone, term by term. The buffers it held (``peak_reserved``: the most held in memory or promised as credit at
    once, at most memory.budget and the spilling partitions' receive buffers) may stay with it, kept for reuse by
    its frame pool or by the allocator; so may the receive areas of the connections open at once (``clients``
    processes, each with a connection per producer or per subpartition it reads and one for its calls, and the
    checker's own). Anything beyond grew with what the run did, not with what it held: a leak."""
    connections = clients * (max(MAX_PRODUCERS, NUM_SUBPARTITIONS) + 1) + 1
    return {"buffers at their peak": status["memory"]["peak_reserved"],
            f"{connections} connections' receive areas": connections * FrameDecoder.STAGING,
            "the interpreter's own": INTERPRETER_GROWTH}


@dataclass
class Slot:
    role: str
    slot: int
    incarnation: int = 0
    proc: subprocess.Popen | None = None

    @property
    def label(self) -> str:
        return f"{self.role}{self.slot:03d}.{self.incarnation:04d}"


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sparkflow-checker-")).resolve()
        (self.workdir / "history").mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.log_fd = os.open(self.workdir / "history" / "checker.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.slots = [Slot("writer", i) for i in range(args.writers)] + [Slot("reader", i) for i in range(args.readers)]
        self.pids: set[int] = set()
        self.killed: set[int] = set()
        self.names = [f"n{i}" for i in range(args.names)]
        self.service: RunningService | None = None
        self.drops = 0
        self._next_count = 0.0

    def log(self, ev: str, **fields) -> None:
        os.write(self.log_fd, (json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n").encode())

    def finding(self, kind: str, message: str) -> None:
        self.log("finding", kind=kind, message=message)

    # ------------------------------------------------------------ processes
    def spawn(self, slot: Slot) -> None:
        err = open(self.workdir / "logs" / f"{slot.label}.err", "wb")
        slot.proc = subprocess.Popen(
            [sys.executable, str(HERE / "checker_clients.py"), slot.role, "--slot", str(slot.slot),
             "--incarnation", str(slot.incarnation), "--settings", str(self.workdir / "settings.json")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=self.workdir)
        err.close()
        self.pids.add(slot.proc.pid)
        self.log("spawn", target=slot.label, pid=slot.proc.pid)

    def respawn(self, slot: Slot) -> None:
        slot.incarnation += 1
        self.spawn(slot)

    def check_exits(self, stopping: bool) -> None:
        for slot in self.slots:
            if slot.proc is None or slot.proc.poll() is None:
                continue
            code = slot.proc.returncode
            if not (stopping and code == 0) and code != -signal.SIGKILL:
                tail = (self.workdir / "logs" / f"{slot.label}.err").read_text(errors="replace")[-1500:]
                self.finding("client_crashed", f"{slot.label} (pid {slot.proc.pid}) exited with {code}:\n{tail}")
            slot.proc = None
            if not stopping:
                self.respawn(slot)

    def kill_one(self) -> None:
        alive = [s for s in self.slots if s.proc is not None and s.proc.poll() is None]
        if not alive:
            return
        victim = self.rng.choice(alive)
        self.log("kill", target=victim.label, pid=victim.proc.pid)
        self.killed.add(victim.proc.pid)
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        victim.proc = None
        self.respawn(victim)

    def stop_clients(self) -> None:
        """Ask every client to finish its operation and exit; after a moment drop every name, so the reads and
        writes still running learn it (and are checked for it); report (with stacks) and kill the ones that
        do not end within their bounds."""
        (self.workdir / "stop").touch()
        self.log("stop")
        b = bounds()
        grace = max(b["first_data"], b["push"] + 2 * b["rpc"]) + self.args.slack + 10
        deadline = time.monotonic() + grace
        self.wait_for_clients(time.monotonic() + 3)
        self.drop_all()
        self.wait_for_clients(deadline)
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                os.kill(slot.proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack to its stderr
                time.sleep(1.0)
                os.kill(slot.proc.pid, signal.SIGKILL)
                self.killed.add(slot.proc.pid)
                slot.proc.wait()
                stacks = (self.workdir / "logs" / f"{slot.label}.err").read_text(errors="replace")[-4000:]
                self.finding("hung_at_end", f"{slot.label} (pid {slot.proc.pid}) still ran {grace:.0f} s after the "
                                            f"stop; its threads:\n{stacks}")
                slot.proc = None
        self.check_exits(stopping=True)

    def wait_for_clients(self, deadline: float) -> None:
        while time.monotonic() < deadline and any(s.proc is not None and s.proc.poll() is None for s in self.slots):
            time.sleep(0.5)

    def drop_all(self) -> None:
        """Drop every name, logged like a writer's drops (the verdict learns which epochs ended when)."""
        svc = self.service
        cfg = ExchangeConfig.load({"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}, spark_conf={})
        for name in self.names:
            self.drops += 1
            self.log("drop_begin", op=self.drops, name=name)
            try:
                result = drop_exchange(name, cfg)
                self.log("drop_end", op=self.drops, name=name, ok=True, partitions=result.get("partitions"))
            except Exception as exc:  # noqa: BLE001 - not found is the usual answer; a dead service is found later
                self.log("drop_end", op=self.drops, name=name, ok=False, error=str(exc), not_found=isinstance(exc, ExchangeNotFound))

    # ------------------------------------------------------------ the service's leftovers
    def service_fds(self) -> list[str]:
        fd_dir = Path(f"/proc/{self.service.proc.pid}/fd")
        out = []
        for fd in fd_dir.iterdir():
            try:
                out.append(os.readlink(fd))
            except OSError:
                pass
        return out

    def spill_files(self) -> set[str]:
        spill = self.service.spill_dir
        return {str(p.relative_to(spill)) for p in spill.rglob("*") if p.is_file()} if spill.exists() else set()

    def arenas(self) -> list[tuple[str, str]]:
        """(kind, description) of the shared-memory arenas of this run's processes still in /dev/shm."""
        service = self.service.proc.pid
        out = []
        for p in Path("/dev/shm").glob("sparkflow-arena-*"):
            try:
                pid = int(p.name.split("-")[2])
            except (IndexError, ValueError):
                continue
            if pid == service:
                out.append(("leftover_shm", f"/dev/shm/{p.name} of the service (pid {pid})"))
            elif pid in self.killed:  # the writer died before the service took the arena over
                out.append(("leftover_shm_killed_client", f"/dev/shm/{p.name} of client pid {pid}, killed with -9"))
            elif pid in self.pids:
                out.append(("leftover_shm", f"/dev/shm/{p.name} of client pid {pid}, which ended normally"))
        return out

    def baseline(self) -> dict:
        self.service.status()  # one connection served: lazily opened things are open
        return {"fds": self.service_fds(), "rss": self.service.rss_bytes(), "private": private_bytes(self.service.proc.pid),
                "spill": self.spill_files()}

    def final_drops_and_leaks(self, base: dict) -> None:
        svc = self.service
        if svc.proc.poll() is not None:
            self.finding("service_died", f"the service (pid {svc.proc.pid}) exited with {svc.proc.returncode}:\n"
                         + (svc.home / "service.log").read_text(errors="replace")[-3000:])
            return
        self.drop_all()
        deadline = time.monotonic() + 20
        while True:  # releasing is prompt; give files and connections a moment to go
            status = svc.status()
            left = (status["exchanges"] or status["partitions"] or len(status["connections"]) > 1
                    or self.spill_files() - base["spill"] or self.arenas())
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for e in status["exchanges"]:
            self.finding("leftover_exchanges", f"exchange {e['name']!r} epoch {e['epoch']} ({e['state']}, "
                                               f"{len(e['producers'])} producers) after the final drops")
        for p in status["partitions"]:
            self.finding("leftover_partitions", "partition after the final drops: "
                         + json.dumps({k: p.get(k) for k in ("partition", "pid", "exchange", "state", "type",
                                                              "finished", "attempt") if k in p})[:400])
        conns = [c for c in status["connections"]]
        if len(conns) > 1:  # one is the status request's own
            self.finding("leftover_connections", f"{len(conns) - 1} client connections open after every client "
                                                 f"ended: {json.dumps(conns)[:600]}")
        for f in sorted(self.spill_files() - base["spill"]):
            self.finding("leftover_spill_files", f"{f} in {svc.spill_dir} after the final drops")
        for kind, arena in self.arenas():
            self.finding(kind, f"{arena} after the final drops")
        fds = self.service_fds()
        extra = list(fds)
        for target in base["fds"]:
            if target in extra:
                extra.remove(target)
        if len(fds) > len(base["fds"]) + 2:
            self.finding("leftover_fds", f"the service holds {len(fds)} descriptors, {len(base['fds'])} at the start; "
                                         f"new ones: {sorted(extra)[:40]}")
        rss, private = svc.rss_bytes(), private_bytes(svc.proc.pid)
        bound = memory_bound(status, self.args.writers + self.args.readers)
        log = (svc.home / "service.log").read_bytes()
        self.end_numbers = {"service_log_bytes": len(log), "service_log_tracebacks": log.count(b"Traceback"),
                            "service_fds_start": len(base["fds"]), "service_fds_end": len(fds),
                            "service_rss_start_mib": round(base["rss"] / 2**20, 1), "service_rss_end_mib": round(rss / 2**20, 1),
                            "service_private_start_mib": round(base["private"] / 2**20, 1),
                            "service_private_end_mib": round(private / 2**20, 1),
                            "service_private_bound_mib": round(sum(bound.values()) / 2**20, 1)}
        if private - base["private"] > sum(bound.values()):
            terms = ", ".join(f"{what} {n / 2**20:.1f}" for what, n in bound.items())
            self.finding("rss_growth", f"the service's own memory (anonymous and shared, RssAnon + RssShmem) grew "
                                       f"from {base['private'] / 2**20:.1f} MiB to {private / 2**20:.1f} MiB, by "
                                       f"{(private - base['private']) / 2**20:.1f} MiB: more than the "
                                       f"{sum(bound.values()) / 2**20:.1f} MiB it may keep ({terms})")

    # ------------------------------------------------------------ the run
    def execute(self) -> int:
        args = self.args
        self.end_numbers: dict = {}
        secret = os.urandom(16).hex()
        # the service and the clients run the code this script imported, whatever the working directory
        # (`python -m` puts the working directory first on the path)
        package_root = str(Path(sparkflow_exchange.__file__).resolve().parent.parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        os.chdir(self.workdir)
        self.service = start_service(self.workdir / "service", secret=secret, conf=SERVICE_CONF)
        svc = self.service
        settings = {"workdir": str(self.workdir), "seed": args.seed, "names": self.names, "unix": svc.unix,
                    "tcp": svc.tcp, "secret": secret, "host_id": svc.info.get("host_id", "127.0.0.1"),
                    "client_options": CLIENT_OPTIONS, "timeouts": bounds(), "slack": args.slack, "pause": args.pause, "stagger": args.stagger,
                    "jvm_readers": args.jvm_readers}
        (self.workdir / "settings.json").write_text(json.dumps(settings, indent=1))
        base = self.baseline()
        self.log("run", argv=sys.argv[1:], service_pid=svc.proc.pid, settings=settings)
        print(f"checker: workdir {self.workdir}, code {package_root}, service pid {svc.proc.pid}, {args.writers} writers, "
              f"{args.readers} readers, {args.duration:g} s, kill -9 every ~{args.kill_every:g} s, seed {args.seed}",
              flush=True)
        started = time.monotonic()
        try:
            for slot in self.slots:
                self.spawn(slot)
            next_kill = started + self.kill_interval()
            next_report = started + 60
            while not self.done(started):
                time.sleep(0.2)
                self.check_exits(stopping=False)
                now = time.monotonic()
                if args.kill_every > 0 and now >= next_kill:
                    self.kill_one()
                    next_kill = now + self.kill_interval()
                if svc.proc.poll() is not None:
                    break
                if now >= next_report:
                    print(f"checker: {now - started:.0f} s", flush=True)
                    next_report = now + 60
            self.stop_clients()
            self.final_drops_and_leaks(base)
        finally:
            for slot in self.slots:  # only on an error of the checker itself: its own children, by pid
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait()
            code = svc.stop()
            if code not in (0, -signal.SIGTERM):
                self.finding("service_died", f"the service exited with {code} when stopped")
        return 0

    def done(self, started: float) -> bool:
        """The duration is over and (up to --max-duration) enough reads returned: a loaded machine gets
        more time instead of a run that checked nothing."""
        elapsed = time.monotonic() - started
        if elapsed < self.args.duration:
            return False
        if (self.args.min_reads <= 0 and self.args.min_jvm_reads <= 0) or elapsed >= self.args.max_duration:
            return True
        if time.monotonic() < self._next_count:
            return False
        self._next_count = time.monotonic() + 2
        returned = jvm_returned = 0
        for path in (self.workdir / "history").glob("reader*.jsonl"):
            text = path.read_bytes()
            ok = text.count(b'"ok":true')  # a reader logs "ok" on its read_end lines only
            returned += ok
            if b'"jvm_reader"' in text:
                jvm_returned += ok
        return returned >= self.args.min_reads and jvm_returned >= self.args.min_jvm_reads

    def kill_interval(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.args.kill_every if self.args.kill_every > 0 else float("inf")


def report(workdir: Path, args: argparse.Namespace, end_numbers: dict | None = None) -> int:
    verdict = analyse(workdir, slack=args.slack, replace_bound=args.replace_bound)
    summary = verdict.summary()
    summary["stats"].update(end_numbers or {})
    summary["workdir"] = str(workdir)
    s = summary["stats"]
    print(f"reads: {s['reads']} ended, {s['reads_ok']} returned ({s['reads_ok_sealed']} sealed, "
          f"{s['reads_ok_pipelined']} pipelined; by type {s['reads_ok_by_type']}), {s['rows_read']:,} rows; "
          f"{s['reads_failed']} failed")
    for what, n in s["read_failures"].items():
        print(f"  read failed at {what}: {n}")
    print(f"writes: {s['writes']} begun, {s['writes_committed']} committed ({s['rows_committed']:,} rows), "
          f"{s['writes_maybe']} outcome unknown, {s['writes_absent']} not committed; drops {s['drops_ok']} of "
          f"{s['drops']}; kill -9: {s['kills']}")
    for what, n in s["write_failures"].items():
        print(f"  write not committed, {what}: {n}")
    numbers = [f"{key} {s[key]}" for key in ("service_fds_start", "service_fds_end", "service_rss_start_mib",
                                             "service_rss_end_mib", "service_private_start_mib",
                                             "service_private_end_mib", "service_private_bound_mib",
                                             "service_log_bytes", "service_log_tracebacks")
               if key in s]
    if numbers:
        print("service: " + ", ".join(numbers))
    violations = summary["violations"]
    if not violations:
        print("violations: none")
    for kind in KINDS:
        if kind in violations:
            print(f"VIOLATION {kind}: {violations[kind]}")
            for example in summary["examples"][kind][:args.examples]:
                print(f"  - {example}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if violations else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of writing and reading (default 60)")
    parser.add_argument("--min-reads", type=int, default=0,
                        help="after --duration, go on until this many reads returned (up to --max-duration)")
    parser.add_argument("--min-jvm-reads", type=int, default=0,
                        help="after --duration, go on until the JVM readers returned this many reads (up to "
                             "--max-duration): a JVM slow to start on a loaded machine still gets checked")
    parser.add_argument("--max-duration", type=float, default=600.0)
    parser.add_argument("--writers", type=int, default=6)
    parser.add_argument("--readers", type=int, default=6)
    parser.add_argument("--jvm-readers", type=int, default=0,
                        help="how many reader slots read through the plugin jar's JVM reader (a JVM each, no Spark)")
    parser.add_argument("--kill-every", type=float, default=8.0, help="mean seconds between kill -9s (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--names", type=int, default=8, help="exchange names written and read")
    parser.add_argument("--pause", type=float, default=0.5, help="each client rests up to this long between operations")
    parser.add_argument("--stagger", type=float, default=2.0,
                        help="a read's subpartitions start up to this many seconds apart, as read tasks do")
    parser.add_argument("--slack", type=float, default=3.0, help="seconds a wait may exceed its bound (load)")
    parser.add_argument("--replace-bound", type=float, default=2.0,
                        help="seconds a writer may take to fail after its exchange is dropped or overwritten")
    parser.add_argument("--workdir", help="where the service, logs and history go (default: a fresh temp dir)")
    parser.add_argument("--json", help="write the summary here as JSON")
    parser.add_argument("--examples", type=int, default=5, help="examples printed per violation kind")
    parser.add_argument("--analyze", metavar="WORKDIR", help="only print the verdict of an earlier run's history")
    args = parser.parse_args(argv)
    if args.json:
        args.json = str(Path(args.json).resolve())  # the run works in its own directory
    if args.analyze:
        return report(Path(args.analyze), args)
    run = Run(args)
    run.execute()
    return report(run.workdir, args, run.end_numbers)


if __name__ == "__main__":
    sys.exit(main())
