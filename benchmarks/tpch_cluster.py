"""TPC-H split into a producer and a consumer application on two simulated hosts, against files on a shared mount.

The cluster (root, Linux), built from network namespaces as ``tests/multihost.py`` builds its hosts (a bridge, one
veth pair per host, addresses in 198.18.0.0/24, each host with its own host name, ``/tmp`` and ``/dev/shm``):

* **storage** (198.18.0.1): the exchange coordinator (``sparkflow-exchange serve``, an ephemeral port) and an
  ``sshd`` (keys generated into the run's directory, an ephemeral port) serving a directory, ``export/``;
* **producer** (198.18.0.2): its exchange service (``serve --no-coordinator``, registered with the coordinator) and
  the producer applications, all on CPU 0 (``taskset -c 0``);
* **consumer** (198.18.0.3): its exchange service and the consumer applications, all on CPU 1 (``taskset -c 1``).

Both application hosts mount the storage host's ``export/`` with ``sshfs`` (FUSE over SSH, cipher
``aes128-gcm@openssh.com``, the mount's process on its host's CPU). The services and applications are configured by
each host's ``spark-defaults.conf`` as an operator's cluster is (``docs/deployment.md``): the coordinator's address,
``bindHost 0.0.0.0`` (each service advertises its host's address), one ``secretFile`` for every host, each host's spill
directory and ``spark.local.dir`` on the machine's disk. The storage host's processes are not pinned: with two CPUs
the storage server has none of its own, and its work (the coordinator's, sshd's) runs wherever the scheduler finds
room. TLS is off (the catalog speaks none).

Links (``--links``, several run interleaved within each round): ``unshaped`` (veths on a bridge: the CPUs are the
limit), ``10gbit`` and ``1gbit``: a token bucket (``tc qdisc ... tbf``) on both ends of every host's veth pair, so
what each host sends and what it receives are each held to the rate. Each link state starts with a plain TCP copy
from the producer host to the consumer host (``--link-check-mb``), its rate reported.

Each query is ``tpch_pipeline.py``'s split (its ``QUERIES``, its data from ``tpchgen-cli``, its child applications
and DuckDB answer check: every answer is compared with DuckDB's on the same files, and a wrong one stops the run).
Every application is a fresh process (``tpch_pipeline.py --child``) with one task slot (``local[1]``, its host's one
CPU; ``--slots``), ``spark.sql.shuffle.partitions`` = ``numSubpartitions`` = 200. The TPC-H tables are read from the
machine's disk by both hosts (a local copy each): only the producer's output crosses the network. Routes:

* ``jvm``: the producer writes the exchange through the JVM catalog (``df.writeTo("exchange.<name>")``, hashed on
  the consumer's key into 200 subpartitions) into its host's service; once it has exited the consumer reads it
  through the catalog (``spark.table``) from the producer host's service over TCP.
* ``format``: the same with ``df.write.format("pipelined")`` / ``spark.read.format("pipelined")`` (the jar serves
  both in the JVM). Not in the default routes.
* ``jvm-concurrent``: both applications started together; the consumer's catalog has ``readWhileWritten=true`` (set
  explicitly, whatever the catalog's default: with ``false`` it reads only committed exchanges and waits for the
  commit) and ``commitTimeout`` (it waits for the exchange's declaration), so it reads while the producer writes.
* ``format-concurrent``: both started together; the consumer's ``spark.read.format("pipelined")`` waits for the
  declaration (``declareTimeout``) and reads while the producer writes.
* ``parquet-sshfs``: the producer writes parquet into its sshfs mount (the storage host's disk), then the consumer
  reads the files through its own mount.
* ``parquet-local``: the producer writes parquet straight into a directory of the consumer host's own disk, then the
  consumer reads it: ``tpch_pipeline.py``'s parquet route. The simulated hosts share one disk, so nothing crosses
  the network: a file handoff whose copy costs nothing, the lower bound of any route through files.
* ``one-app``: the whole query in one application over both CPUs (``taskset -c 0,1``, ``local[2]``, on the consumer
  host), no exchange.

Per run: each application's start and end (seconds from the route's start: the first application's launch; an
application's wall clock is its process's, session start included), its work (after its session started: reading,
computing, writing; a concurrent consumer's includes its waits for the producer), and the consumer's end minus the
producer's end (how long the consumer ran on after its producer was done). The route's time is the last exit. Also
the CPU-seconds of each host's exchange service over the route and the machine's busy CPU-seconds.

Rounds: ``--rounds`` (medians reported), in each round every link state, query and route once, routes in reverse
order every other round (link states too). After every route the exchange is dropped and the files removed; the
JSON (all runs and the medians) is rewritten after every route, so an interrupted run keeps what it measured; each
run also records the commit and the plugin jar's digest it ran with (a jar rebuilt during a run is reported). A plot
(matplotlib): per scale factor, link and query, each route's producer and consumer as bars from start to end
(medians).

Needs root, ``ip``, ``tc``, ``taskset``, ``nsenter``, ``unshare``, Java, ``sshfs``, ``sshd``, ``ssh-keygen`` and
``/dev/fuse``: on Debian ``apt-get install sshfs openssh-server`` (nothing is installed here); the TPC-H tools:
``.venv/bin/python -m pip install -e ".[bench]"``. Everything started is ended by pid, the mounts unmounted and the
namespaces, veths and bridge removed, also on a failure.

Run: .venv/bin/python benchmarks/tpch_cluster.py --sf 1 [5] --links unshaped,10gbit,1gbit [--queries 3,5,9,18]
         [--rounds 3] [--routes jvm,jvm-concurrent,format-concurrent,parquet-sshfs,parquet-local,one-app]
Quick check: .venv/bin/python benchmarks/tpch_cluster.py --sf 1 --queries 3 --rounds 1 --links unshaped
Writes benchmarks/tpch_cluster-sf<..>-<links>-latest.json (--out) and a plot (--plot);
the plot of earlier runs: .venv/bin/python benchmarks/tpch_cluster.py --replot a.json b.json [--plot p.png]
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ME = Path(__file__).resolve()
HERE = ME.parent
TESTS = HERE.parent / "tests"
PIPELINE = HERE / "tpch_pipeline.py"
ROUTES = ("jvm", "format", "jvm-concurrent", "format-concurrent", "parquet-sshfs", "parquet-local", "one-app")
DEFAULT_ROUTES = ("jvm", "jvm-concurrent", "format-concurrent", "parquet-sshfs", "parquet-local", "one-app")
CONCURRENT = ("jvm-concurrent", "format-concurrent")
# the producer's and the consumer's --io of tpch_pipeline's child, and the consumer's own settings
IO = {"jvm": ("jvm", "jvm", []), "format": ("format", "format", []),
      "jvm-concurrent": ("jvm", "jvm-wait", ["spark.sql.catalog.exchange.readWhileWritten=true"]),
      "format-concurrent": ("format", "format-wait", []),
      "parquet-sshfs": ("parquet", "parquet", []), "parquet-local": ("parquet", "parquet", [])}
# tc tbf per link state: rate, burst (at least a GSO segment, and enough to keep the rate with the timer's tick),
# queue latency
LINKS = {"unshaped": None, "10gbit": ("10gbit", "4mb", "5ms"), "1gbit": ("1gbit", "256kb", "5ms")}
PRODUCER_CPU, CONSUMER_CPU = "0", "1"
CIPHER = "aes128-gcm@openssh.com"
MOUNT_TIMEOUT = 60.0  # s for sshd to listen or an sshfs mount to appear
LINK_CHECK_TIMEOUT = 120.0


# ---------------------------------------------------------------- the parts run inside a host
def part_recv() -> None:
    """consumer host: accept one connection on an ephemeral port (printed first), count what arrives; JSON."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        server.settimeout(LINK_CHECK_TIMEOUT)
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
        buf = memoryview(bytearray(4 << 20))
        got = 0
        with conn:
            conn.settimeout(LINK_CHECK_TIMEOUT)
            started = time.perf_counter()
            while n := conn.recv_into(buf):
                got += n
            took = time.perf_counter() - started
    print(json.dumps({"bytes": got, "seconds": took}), flush=True)


def part_send(host: str, port: int, size: int) -> None:
    """producer host: send ``size`` bytes from memory to host:port."""
    chunk = memoryview(os.urandom(4 << 20))
    with socket.create_connection((host, port), timeout=LINK_CHECK_TIMEOUT) as conn:
        left = size
        while left > 0:
            n = min(left, len(chunk))
            conn.sendall(chunk[:n])
            left -= n


def part_free_port(ip: str) -> None:
    """Print a port free on ``ip`` in this host (the kernel's ephemeral choice)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        print(s.getsockname()[1], flush=True)


def part_drop(name: str) -> None:
    """Any application host: the exchange's size at the coordinator, then drop it; JSON."""
    import sparkflow_exchange

    summary = next((s for s in sparkflow_exchange.list_exchanges() if s.name == name), None)
    size = {} if summary is None else {"rows": summary.rows, "bytes": summary.bytes, "raw_bytes": summary.raw_bytes,
                                       "producers": summary.producers, "subpartitions": summary.num_subpartitions}
    if summary is not None:
        sparkflow_exchange.drop_exchange(name)
    print(json.dumps(size), flush=True)


# ---------------------------------------------------------------- the cluster
def missing_tools() -> str | None:
    """What this machine lacks for the cluster, and how to get it (None when nothing)."""
    sys.path.insert(0, str(TESTS))
    import multihost

    why = multihost.unavailable()
    if why:
        return why
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    wanted = {"tc": "apt-get install iproute2", "taskset": "apt-get install util-linux",
              "sshfs": "apt-get install sshfs", "ssh": "apt-get install openssh-client",
              "ssh-keygen": "apt-get install openssh-client", "sshd": "apt-get install openssh-server"}
    lacking = [f"{tool} ({how})" for tool, how in wanted.items() if shutil.which(tool, path=path) is None]
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        lacking.append("fusermount3 (apt-get install fuse3)")
    if lacking:
        return "missing: " + ", ".join(lacking) + "; on Debian: apt-get install sshfs openssh-server"
    if not Path("/dev/fuse").exists():
        return "/dev/fuse is missing: this kernel has no FUSE (sshfs needs it)"
    cpus = os.sched_getaffinity(0)
    if not {int(PRODUCER_CPU), int(CONSUMER_CPU)} <= cpus:
        return f"CPUs {PRODUCER_CPU} and {CONSUMER_CPU} are needed (this process may use {sorted(cpus)})"
    return None


def make_cluster(keep: bool):
    """The three hosts (a subclass of tests/multihost.py's Cluster, built when started)."""
    sys.path.insert(0, str(TESTS))
    import multihost

    class Hosts(multihost.Cluster):
        """storage (coordinator, sshd), producer and consumer (a service each, an sshfs mount each); no Spark
        standalone (applications run local), no TLS, every port ephemeral."""

        def __init__(self) -> None:
            super().__init__(hosts=3, keep=keep)
            for host, name in zip(self.hosts, ("storage", "producer", "consumer")):
                host.name = name
                host.dir = self.root / name
            self.storage, self.producer, self.consumer = self.hosts
            self.cpu = {"producer": PRODUCER_CPU, "consumer": CONSUMER_CPU}
            self.keys = self.root / "ssh"
            self.export = self.storage.dir / "export"
            self.local = self.consumer.dir / "local"  # the consumer host's own disk
            self.mounts: dict[str, Path] = {}  # host name -> its sshfs mount point
            self.sshd_port = 0
            self.address: str | None = None  # the coordinator's, once it listens

        @property
        def coordinator(self) -> str:
            return self.address or ""

        def start(self) -> "Hosts":
            multihost.sweep_stale(self.tag)
            try:
                self._network()
                for host in self.hosts:
                    self._holder(host)
                self.etc.mkdir(parents=True, exist_ok=True)
                os.chmod(self.etc, 0o700)
                self.secret_file.write_text(os.urandom(24).hex() + "\n")
                os.chmod(self.secret_file, 0o600)
                for host in self.hosts:
                    self._spark_defaults(host)  # the storage host's without a coordinator: it is one
                info = self.start_service(self.storage)
                self.address = info["tcp"]
                for host in (self.producer, self.consumer):
                    self._spark_defaults(host)
                    self.start_service(host)
                self._sshd()
                for host in (self.producer, self.consumer):
                    self._mount(host)
            except BaseException:
                self.stop()
                raise
            return self

        def spark_defaults(self, host) -> str:
            lines = ["spark.ui.enabled false", "spark.ui.showConsoleProgress false",
                     f"spark.pyspark.python {multihost.PYTHON}", f"spark.pyspark.driver.python {multihost.PYTHON}",
                     f"spark.local.dir {host.dir / 'spark-local'}",
                     "spark.sparkflow.exchange.bindHost 0.0.0.0",
                     f"spark.sparkflow.exchange.secretFile {self.secret_file}",
                     f"spark.sparkflow.exchange.spillDir {host.dir / 'spill'}"]
            if self.address:
                lines.append(f"spark.sparkflow.exchange.coordinator {self.address}")
            return "\n".join(lines) + "\n"

        def service_args(self, host) -> list[str]:
            serve = [str(Path(multihost.PYTHON).parent / "sparkflow-exchange"), "serve"]
            if host is self.storage:
                return serve  # coordinator; every setting from its spark-defaults.conf, an ephemeral port
            return ["taskset", "-c", self.cpu[host.name], *serve, "--no-coordinator"]

        # ------------------------------------------------ the shared directory
        def _sshd(self) -> None:
            keys = self.keys
            keys.mkdir(mode=0o700)
            for key in ("host_key", "client_key"):
                multihost._sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key, "-f", str(keys / key))
            (keys / "authorized_keys").write_text((keys / "client_key.pub").read_text())
            self.export.mkdir(parents=True)
            # sshd wants its privilege separation directory, /run/sshd: a /run of the storage host's own
            got = self.storage.run(["sh", "-c", "mount -t tmpfs -o mode=755 tmpfs /run && mkdir -m 755 /run/sshd"],
                                   timeout=30)
            if got.returncode != 0:
                raise multihost.HostError(f"storage: a private /run: {got.stderr.strip()}")
            self.sshd_port = int(self.storage.run([multihost.PYTHON, str(ME), "--part", "free-port",
                                                   self.storage.ip], timeout=60).stdout.split()[0])
            (keys / "sshd_config").write_text("\n".join([
                f"Port {self.sshd_port}", f"ListenAddress {self.storage.ip}", f"HostKey {keys / 'host_key'}",
                f"PidFile {keys / 'sshd.pid'}", f"AuthorizedKeysFile {keys / 'authorized_keys'}",
                "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "UseDNS no",
                "Subsystem sftp internal-sftp", "LogLevel INFO", ""]))
            host_key = (keys / "host_key.pub").read_text().split()
            (keys / "known_hosts").write_text(f"[{self.storage.ip}]:{self.sshd_port} {host_key[0]} {host_key[1]}\n")
            sshd = shutil.which("sshd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
            self.storage.start("sshd", [sshd, "-D", "-e", "-f", str(keys / "sshd_config")])
            multihost.wait_for("sshd listening on the storage host",
                               lambda: self._alive(self.storage, "sshd")
                               and "Server listening" in self.storage.log("sshd"), timeout=MOUNT_TIMEOUT)

        def _mount(self, host) -> None:
            point = host.dir / "shared"
            point.mkdir(parents=True)
            options = ",".join([f"Port={self.sshd_port}", f"IdentityFile={self.keys / 'client_key'}",
                                f"UserKnownHostsFile={self.keys / 'known_hosts'}", "StrictHostKeyChecking=yes",
                                "BatchMode=yes", f"Ciphers={CIPHER}", "Compression=no"])
            host.start("sshfs", ["taskset", "-c", self.cpu[host.name], "sshfs", "-f", "-F", "/dev/null",
                                 "-o", options, f"root@{self.storage.ip}:{self.export}", str(point)])

            def mounted() -> bool:
                self._alive(host, "sshfs")
                table = Path(f"/proc/{host.procs['sshfs'].pid}/mountinfo").read_text()
                return any(line.split()[4] == str(point) and "fuse.sshfs" in line for line in table.splitlines())
            multihost.wait_for(f"the sshfs mount on {host.name}", mounted, timeout=MOUNT_TIMEOUT)
            self.mounts[host.name] = point

        def unmount(self) -> None:
            for name, point in list(self.mounts.items()):
                host = next(h for h in self.hosts if h.name == name)
                fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
                if host.holder is not None and host.run([fusermount, "-u", str(point)], timeout=30).returncode:
                    host.run([fusermount, "-u", "-z", str(point)], timeout=30)  # busy: detached now, gone when idle
                proc = host.procs.pop("sshfs", None)
                if proc is not None:
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        multihost._end(proc.pid, proc)
                del self.mounts[name]

        def stop(self) -> None:
            self.unmount()
            proc = self.storage.procs.pop("sshd", None)
            if proc is not None:
                multihost._end(proc.pid, proc)
            super().stop()

        # ------------------------------------------------ the links
        def shape(self, link: str) -> None:
            """Every veth pair's two ends: the host's eth0 (what it sends) and the bridge's end (what it
            receives)."""
            spec = LINKS[link]
            for host in self.hosts:
                for where, dev in ((["ip", "netns", "exec", host.netns, "tc"], "eth0"), (["tc"], host.veth)):
                    subprocess.run([*where, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=30)
                    if spec is not None:
                        rate, burst, latency = spec
                        multihost._sh(*where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                                      "burst", burst, "latency", latency)

        def link_rate(self, megabytes: int) -> dict:
            """A plain TCP copy of ``megabytes`` MB from the producer host to the consumer host."""
            recv = subprocess.Popen(self.consumer.command([multihost.PYTHON, str(ME), "--part", "recv"]),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=self.consumer.env(), stdin=subprocess.DEVNULL)
            try:
                port = int(recv.stdout.readline().strip() or 0)
                if not port:
                    raise multihost.HostError(f"link check: the receiver did not start: {recv.stderr.read()[-2000:]}")
                sent = self.producer.run([multihost.PYTHON, str(ME), "--part", "send", self.consumer.ip, str(port),
                                          str(megabytes * 1_000_000)], timeout=LINK_CHECK_TIMEOUT)
                if sent.returncode != 0:
                    raise multihost.HostError(f"link check: the sender failed: {sent.stderr[-2000:]}")
                out, _ = recv.communicate(timeout=LINK_CHECK_TIMEOUT)
                got = json.loads(out.strip().splitlines()[-1])
            finally:
                if recv.poll() is None:
                    multihost._end(recv.pid, recv)
            return {"mb": got["bytes"] / 1e6, "seconds": got["seconds"], "mb_s": got["bytes"] / 1e6 / got["seconds"]}

    return Hosts()


# ---------------------------------------------------------------- the run
class Run:
    """Applications on the hosts, one route at a time; every process started here is ended by its pid."""

    def __init__(self, cluster, args) -> None:
        self.cluster = cluster
        self.args = args
        self.logs = cluster.root / "logs"
        self.logs.mkdir()
        self.count = 0
        self.live: list[subprocess.Popen] = []

    def start(self, host, cpus: str, role: str, io: str, query: int, data: Path, *, exchange: str = "",
              path: str = "", slots: int = 1, conf: list[str] = ()) -> dict:
        self.count += 1
        log = self.logs / f"{self.count:04d}-{host.name}-q{query}-{role}-{io}"
        cmd = ["taskset", "-c", cpus, sys.executable, str(PIPELINE), "--child", role, "--io", io,
               "--query", str(query), "--data", str(data), "--exchange", exchange, "--path", path,
               "--shuffle-partitions", str(self.args.shuffle_partitions), "--driver-memory", self.args.driver_memory,
               "--conf", f"spark.master=local[{slots}]"]
        for setting in [*conf, *self.args.conf]:
            cmd += ["--conf", setting]
        out, err = open(f"{log}.out", "w"), open(f"{log}.err", "w")
        started = time.perf_counter()
        proc = subprocess.Popen(host.command(cmd), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=host.env(spark=True), cwd=host.dir, start_new_session=True)
        out.close()
        err.close()
        self.live.append(proc)
        return {"proc": proc, "log": log, "started": started, "host": host.name}

    def wait(self, apps: list[dict]) -> None:
        """Until every one of ``apps`` exited (each one's end noted within 20 ms), at most --app-timeout."""
        deadline = time.monotonic() + self.args.app_timeout
        while any("ended" not in a for a in apps):
            for a in apps:
                if "ended" not in a and a["proc"].poll() is not None:
                    a["ended"] = time.perf_counter()
            if time.monotonic() > deadline:
                for a in apps:
                    if "ended" not in a:
                        self._end(a["proc"])
                sys.exit(f"an application ran over --app-timeout {self.args.app_timeout:.0f} s: "
                         + ", ".join(a["log"].name for a in apps if "ended" not in a))
            time.sleep(0.02)
        for a in apps:
            self.live.remove(a["proc"])

    def result(self, app: dict, t0: float) -> dict:
        text = Path(f"{app['log']}.out").read_text()
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        if app["proc"].returncode != 0 or line is None:
            sys.exit(f"{app['log'].name} failed (exit {app['proc'].returncode}):\n{text[-2000:]}\n"
                     f"{Path(str(app['log']) + '.err').read_text()[-6000:]}")
        out = json.loads(line[7:])
        return {"host": app["host"], "start_s": app["started"] - t0, "end_s": app["ended"] - t0,
                "wall_s": app["ended"] - app["started"], "session_s": out["session_s"], "work_s": out["work_s"],
                "jvm_cpu_s": out.get("jvm_cpu_s"), "shuffles": out.get("shuffles", []), "rows": out.get("rows")}

    def route(self, data: Path, query: int, route: str, name: str) -> dict:
        """One route of one query: its applications' times, the answer, the exchange's or the files' size."""
        c = self.cluster
        os.sync()  # the previous route's dirty pages are not this one's to write back
        services = {h.name: h.procs["service"].pid for h in (c.producer, c.consumer)}
        from spark_common import cpu_seconds

        cpu_before = {n: cpu_seconds(p) for n, p in services.items()}
        t0 = time.perf_counter()
        if route == "one-app":
            whole = self.start(c.consumer, f"{PRODUCER_CPU},{CONSUMER_CPU}", "whole", "none", query, data, slots=2)
            self.wait([whole])
            apps = {"whole": self.result(whole, t0)}
            outcome = {"seconds": apps["whole"]["end_s"], "apps": apps, "rows": apps["whole"].pop("rows")}
        else:
            sink, source, consumer_conf = IO[route]
            files = {"parquet-sshfs": (c.mounts.get("producer"), c.mounts.get("consumer")),
                     "parquet-local": (c.local, c.local)}.get(route)
            paths = ("", "") if files is None else (str(files[0] / name), str(files[1] / name))
            try:
                produce = dict(exchange=name, path=paths[0], slots=self.args.slots)
                consume = dict(exchange=name, path=paths[1], slots=self.args.slots, conf=consumer_conf)
                if route in CONCURRENT:  # the consumer first: it waits for the producer's declaration
                    consumer = self.start(c.consumer, CONSUMER_CPU, "consume", source, query, data, **consume)
                    producer = self.start(c.producer, PRODUCER_CPU, "produce", sink, query, data, **produce)
                    self.wait([producer, consumer])
                else:
                    producer = self.start(c.producer, PRODUCER_CPU, "produce", sink, query, data, **produce)
                    self.wait([producer])
                    consumer = self.start(c.consumer, CONSUMER_CPU, "consume", source, query, data, **consume)
                    self.wait([consumer])
                apps = {"producer": self.result(producer, t0), "consumer": self.result(consumer, t0)}
                outcome = {"seconds": max(a["end_s"] for a in apps.values()), "apps": apps,
                           "rows": apps["consumer"].pop("rows"),
                           "consumer_end_minus_producer_end_s": apps["consumer"]["end_s"] - apps["producer"]["end_s"]}
                apps["producer"].pop("rows")
                if files is not None:
                    written = c.export / name if route == "parquet-sshfs" else c.local / name
                    outcome["parquet_bytes"] = sum(f.stat().st_size for f in written.rglob("*") if f.is_file())
            finally:
                if files is None:
                    outcome_exchange = self.drop(name)
                else:
                    outcome_exchange = None
                    for directory in (c.export / name, c.local / name):
                        shutil.rmtree(directory, ignore_errors=True)
            if outcome_exchange is not None:
                outcome["exchange"] = outcome_exchange
        outcome["service_cpu_s"] = {n: _delta(cpu_seconds(p), cpu_before[n]) for n, p in services.items()}
        return outcome

    def drop(self, name: str) -> dict:
        got = self.cluster.consumer.run([sys.executable, str(ME), "--part", "drop", name], timeout=120)
        lines = [x for x in got.stdout.splitlines() if x.startswith("{")]
        if got.returncode != 0 or not lines:
            print(f"(dropping {name} failed: {got.stderr.strip()[-2000:]})", flush=True)
            return {}
        return json.loads(lines[-1])

    def _end(self, proc: subprocess.Popen) -> None:
        import multihost

        multihost._end(proc.pid, proc)

    def end(self) -> None:
        """The applications still running (a failed or interrupted run), each by its pid."""
        for proc in self.live:
            if proc.poll() is None:
                self._end(proc)
        self.live.clear()


def code_version() -> dict:
    """The working tree's commit and whether the package or the jar's sources differ from it, and the jar's digest:
    a run on a tree others change records what each route ran."""
    import hashlib

    import sparkflow_exchange

    def git(*a: str) -> str:
        got = subprocess.run(["git", *a], cwd=HERE.parent, capture_output=True, text=True, timeout=30)
        return got.stdout.strip() if got.returncode == 0 else ""
    jar = Path(sparkflow_exchange.plugin_jar())
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "changed": bool(git("status", "--porcelain", "--", "sparkflow_exchange", "jvm-stub")),
            "jar_sha1": hashlib.sha1(jar.read_bytes()).hexdigest()[:12] if jar.exists() else None}


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 2)


# ---------------------------------------------------------------- figures
def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(results: dict) -> dict:
    """Per scale factor, link, query and route: the medians of the rounds."""
    summary: dict = {}
    for sf, by_link in results.items():
        for link, by_query in by_link.items():
            for q, by_route in by_query.items():
                medians = {}
                for route, outs in by_route.items():
                    m: dict = {"seconds": _median(o["seconds"] for o in outs), "rounds": [o["seconds"] for o in outs],
                               "consumer_end_minus_producer_end_s":
                                   _median(o.get("consumer_end_minus_producer_end_s") for o in outs)}
                    for role in ("producer", "consumer", "whole"):
                        if role in outs[0]["apps"]:
                            m[role] = {key: _median(o["apps"][role][key] for o in outs)
                                       for key in ("start_s", "end_s", "work_s", "session_s", "jvm_cpu_s")}
                    m["service_cpu_s"] = {h: _median(o["service_cpu_s"].get(h) for o in outs)
                                          for h in outs[0]["service_cpu_s"]}
                    m["busy_cpu_s"] = _median(o.get("busy_cpu_s") for o in outs)
                    m["mb_between"] = _median(((o.get("exchange") or {}).get("bytes") or o.get("parquet_bytes") or 0)
                                              / 1e6 for o in outs) if route != "one-app" else None
                    m["consumer_shuffles"] = len(outs[0]["apps"].get("consumer", outs[0]["apps"].get("whole"))
                                                 ["shuffles"])
                    medians[route] = m
                for m in medians.values():
                    for base in ("parquet-sshfs", "parquet-local", "one-app"):
                        b = medians.get(base, {}).get("seconds")
                        m[f"over_{base}"] = m["seconds"] / b if b and m["seconds"] else None
                summary.setdefault(sf, {}).setdefault(link, {})[q] = medians
    return summary


def _cell(value: float | None, fmt: str = ".1f") -> str:
    return "–" if value is None else format(value, fmt)


def _span(medians: dict, role: str) -> str:
    a = medians.get(role)
    return "–" if a is None else f"{a['start_s']:.1f}–{a['end_s']:.1f} ({a['work_s']:.1f})"


def table(summary: dict) -> str:
    head = ("| sf | link | query | route | s (median) | producer start–end (work) | consumer start–end (work) | "
            "consumer end − producer end | / parquet-sshfs | / parquet-local | / one-app | MB between | "
            "consumer shuffles | rounds |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for sf, by_link in summary.items():
        for link, by_query in by_link.items():
            for q, by_route in by_query.items():
                for route, m in by_route.items():
                    producer = _span(m, "producer") if "producer" in m else f"whole: {_span(m, 'whole')}"
                    lines.append(f"| {sf} | {link} | {q} | {route} | {m['seconds']:.1f} | {producer} | "
                                 f"{_span(m, 'consumer')} | {_cell(m['consumer_end_minus_producer_end_s'])} | "
                                 f"{_cell(m['over_parquet-sshfs'], '.2f')} | {_cell(m['over_parquet-local'], '.2f')} | "
                                 f"{_cell(m['over_one-app'], '.2f')} | {_cell(m['mb_between'], '.0f')} | "
                                 f"{m['consumer_shuffles']} | "
                                 + " ".join(f"{s:.1f}" for s in m["rounds"]) + " |")
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> bool:
    """Per scale factor and link (rows) and query (columns): each route's producer and consumer as bars from their
    start to their end (medians, seconds from the route's start); False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("no plot: matplotlib is missing (.venv/bin/python -m pip install -e '.[bench]')", flush=True)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(sf, link) for sf in sorted(summary, key=float) for link in summary[sf]]
    queries = sorted({q for sf, link in rows for q in summary[sf][link]}, key=lambda q: int(q[1:]))
    if not rows or not queries:
        return False
    fig, axes = plt.subplots(len(rows), len(queries), figsize=(4.6 * len(queries), 0.5 + 2.9 * len(rows)),
                             squeeze=False, sharex="row")
    colors = {"producer": "tab:blue", "consumer": "tab:orange", "whole": "tab:green"}
    for r, (sf, link) in enumerate(rows):
        for c, q in enumerate(queries):
            ax = axes[r][c]
            by_route = summary[sf][link].get(q, {})
            names = list(by_route)
            for y, route in enumerate(names):
                m = by_route[route]
                for role, dy in (("producer", 0.2), ("consumer", -0.2), ("whole", 0.0)):
                    a = m.get(role)
                    if a and a["start_s"] is not None:
                        ax.barh(y + dy, a["end_s"] - a["start_s"], left=a["start_s"], height=0.38 if dy else 0.6,
                                color=colors[role], label=role if y == 0 or role == "whole" else None)
                ax.text(m["seconds"], y, f" {m['seconds']:.0f}", va="center", fontsize=7)
            ax.set_yticks(range(len(names)), names, fontsize=7)
            ax.invert_yaxis()
            ax.set_title(f"TPC-H {q}, sf {sf}, {link}", fontsize=9)
            if r == len(rows) - 1:
                ax.set_xlabel("seconds from the route's start (medians)")
    handles = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sf", type=float, nargs="+", default=[1.0], help="scale factor(s), e.g. --sf 1 5")
    parser.add_argument("--queries", default="3,5,9,18")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--links", default="unshaped", help=f"link states, comma-separated: {', '.join(LINKS)}")
    parser.add_argument("--routes", default=",".join(DEFAULT_ROUTES), help=f"of {', '.join(ROUTES)}")
    parser.add_argument("--slots", type=int, default=1, help="task slots (local[N]) of each host's applications")
    parser.add_argument("--shuffle-partitions", type=int, default=200,
                        help="spark.sql.shuffle.partitions of every application and the exchange's numSubpartitions")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for every application (repeatable)")
    parser.add_argument("--link-check-mb", type=int, default=200, help="MB of the plain TCP copy per link state")
    parser.add_argument("--app-timeout", type=float, default=1800.0, help="seconds an application may run")
    parser.add_argument("--out", type=Path, help="the JSON (default benchmarks/tpch_cluster-sf<..>-<links>-latest.json)")
    parser.add_argument("--plot", type=Path, help="the plot, a PNG (default: the JSON's name with .png)")
    parser.add_argument("--keep", action="store_true", help="keep the hosts' files and logs (in /var/tmp)")
    parser.add_argument("--replot", type=Path, nargs="+", metavar="JSON", help="no run: plot earlier runs' JSON")
    parser.add_argument("--part", nargs="+", help=argparse.SUPPRESS)  # what runs inside a host
    args = parser.parse_args()
    if args.part:
        kind, *rest = args.part
        {"recv": lambda: part_recv(), "send": lambda: part_send(rest[0], int(rest[1]), int(rest[2])),
         "free-port": lambda: part_free_port(rest[0]), "drop": lambda: part_drop(rest[0])}[kind]()
        return
    if args.replot:
        results: dict = {}
        for path in args.replot:
            for sf, by_link in json.loads(path.read_text())["runs"].items():
                for link, by_query in by_link.items():
                    results.setdefault(sf, {}).setdefault(link, {}).update(by_query)
        target = args.plot or HERE / "tpch_cluster.png"
        if not plot(summarize(results), target):
            sys.exit("no plot")
        print(f"plot: {target}")
        return
    queries = [int(q) for q in args.queries.split(",") if q.strip()]
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    links = [x.strip() for x in args.links.split(",") if x.strip()]
    for r in routes:
        if r not in ROUTES:
            parser.error(f"unknown route {r!r}: {', '.join(ROUTES)}")
    for x in links:
        if x not in LINKS:
            parser.error(f"unknown link state {x!r}: {', '.join(LINKS)}")
    sys.path.insert(0, str(HERE))
    import tpch_pipeline

    for q in queries:
        if q not in tpch_pipeline.QUERIES:
            parser.error(f"query {q} is not in tpch_pipeline.QUERIES: {sorted(tpch_pipeline.QUERIES)}")
    why = missing_tools()
    if why:
        sys.exit(f"cannot build the cluster: {why}")
    name = f"tpch_cluster-sf{'+'.join(f'{s:g}' for s in args.sf)}-{'+'.join(links)}-latest"
    out_path = args.out or HERE / f"{name}.json"
    plot_path = args.plot or out_path.with_suffix(".png")

    datasets = {sf: tpch_pipeline.ensure_data(sf) for sf in args.sf}
    expected = {}
    for sf, data in datasets.items():
        for q in queries:
            expected[sf, q] = tpch_pipeline.reference(data, q)
            print(f"sf {sf:g} Q{q}: DuckDB's answer has {len(expected[sf, q])} rows", flush=True)
    cluster = make_cluster(args.keep)

    def on_signal(signum, _frame):
        raise SystemExit(f"stopped by signal {signum}: ending the applications, unmounting, removing the hosts")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    atexit.register(cluster.stop)  # idempotent: also after a failure outside the try below
    run = None
    out: dict = {"sf": args.sf, "queries": queries, "routes": routes, "links": links, "rounds": args.rounds,
                 "slots": args.slots, "shuffle_partitions": args.shuffle_partitions,
                 "driver_memory": args.driver_memory, "conf": args.conf,
                 "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "load_before": os.getloadavg(), "code": code_version(), "link_checks": {}, "runs": {}}
    try:
        print(f"building the hosts in {cluster.root} ...", flush=True)
        started = time.monotonic()
        cluster.start()
        print(f"hosts up in {time.monotonic() - started:.0f} s: coordinator {cluster.coordinator}; services "
              + ", ".join(f"{h.name} {h.info.get('tcp')}" for h in (cluster.producer, cluster.consumer))
              + f"; sshd {cluster.storage.ip}:{cluster.sshd_port}, mounted at "
              + ", ".join(str(p) for p in cluster.mounts.values()), flush=True)
        run = Run(cluster, args)
        for sf, data in datasets.items():
            for round_ in range(args.rounds):
                forward = round_ % 2 == 0  # in reverse every other round: a drift of the machine falls on all alike
                for link in links if forward else links[::-1]:
                    cluster.shape(link)
                    check = cluster.link_rate(args.link_check_mb)
                    out["link_checks"].setdefault(link, []).append(check)
                    print(f"link {link}: a plain TCP copy producer -> consumer {check['mb_s']:,.0f} MB/s", flush=True)
                    for q in queries:
                        for route in routes if forward else routes[::-1]:
                            tag = f"tpch_c_sf{sf:g}_q{q}_{route}_{link}_{round_}".replace(".", "_").replace("-", "_")
                            version = code_version()
                            if version["jar_sha1"] != out["code"]["jar_sha1"]:
                                print(f"(the plugin jar changed since the run started: {version})", flush=True)
                            busy = tpch_pipeline.busy_cpu_seconds()
                            outcome = run.route(data, q, route, tag)
                            outcome["busy_cpu_s"] = round(tpch_pipeline.busy_cpu_seconds() - busy, 1)
                            rows = outcome.pop("rows")
                            wrong = tpch_pipeline.differences(rows, expected[sf, q])
                            if wrong:
                                sys.exit(f"WRONG ANSWER: sf {sf:g} Q{q} route {route}, link {link}, round "
                                         f"{round_ + 1}:\n  " + "\n  ".join(wrong))
                            outcome["round"] = round_
                            outcome["code"] = version
                            out["runs"].setdefault(f"{sf:g}", {}).setdefault(link, {}).setdefault(
                                f"Q{q}", {}).setdefault(route, []).append(outcome)
                            out["summary"] = summarize(out["runs"])
                            out_path.write_text(json.dumps(out, indent=1))
                            print(f"sf {sf:g} round {round_ + 1} {link} Q{q} {route}: {outcome['seconds']:.1f} s ("
                                  + ", ".join(f"{role} {a['start_s']:.1f}-{a['end_s']:.1f} work {a['work_s']:.1f}"
                                              for role, a in outcome["apps"].items())
                                  + ("" if "consumer_end_minus_producer_end_s" not in outcome else
                                     f"; consumer end - producer end {outcome['consumer_end_minus_producer_end_s']:.1f}")
                                  + f"); busy CPU-s {outcome['busy_cpu_s']:.0f}; answer checked", flush=True)
        cluster.shape("unshaped")
    finally:
        if run is not None:
            run.end()
        cluster.stop()
    out["load_after"] = os.getloadavg()
    out["ended"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out["summary"] = summarize(out["runs"])
    out_path.write_text(json.dumps(out, indent=1))
    jars = {o["code"]["jar_sha1"] for by_link in out["runs"].values() for by_q in by_link.values()
            for by_r in by_q.values() for outs in by_r.values() for o in outs}
    print(f"\ncode: {out['code']['commit']}" + (" (package or jar sources changed)" if out["code"]["changed"] else "")
          + (f"; THE PLUGIN JAR CHANGED DURING THE RUN ({len(jars)} versions: see each run's code)"
             if len(jars) > 1 else ""))
    print(f"medians of {args.rounds} round(s); load average before {out['load_before'][0]:.1f}, after "
          f"{out['load_after'][0]:.1f}; every answer equal to DuckDB's; {args.slots} task slot(s) per host's "
          f"application, one-app local[2]\n")
    for link, checks in out["link_checks"].items():
        print(f"link {link}: plain TCP copy producer -> consumer "
              + ", ".join(f"{c['mb_s']:,.0f}" for c in checks) + " MB/s")
    print()
    print(table(out["summary"]))
    if plot(out["summary"], plot_path):
        print(f"\nplot: {plot_path}")
    print(f"JSON: {out_path}")


if __name__ == "__main__":
    main()
