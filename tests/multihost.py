"""A cluster of several hosts on one Linux machine: network namespaces, Spark standalone, exchange services.

Each host is a network namespace on a shared bridge (addresses 198.18.0.1, .2, ...: the benchmarking
range) with one long-lived *holder* process that gives it a host name, a private ``/tmp`` and
``/dev/shm`` and an ``/etc/hosts`` that names only itself (mapped to 127.0.1.1, as many distributions
do; the other hosts are known by address only). Every process of a host joins the holder's namespaces.

The deployment is the one docs/deployment.md describes: Spark's master on host0 and a worker on each
other host; ``sparkflow-exchange serve`` as the coordinator on host0 and ``serve --no-coordinator`` on
every worker host, all configured by the host's ``spark-defaults.conf`` (shared secret file, TLS with a
CA and a certificate naming the hosts' addresses). Applications run on host0, configured by that file
alone.

Needs root (namespaces, mounts), ``ip``, ``unshare``, ``nsenter``, ``openssl`` and Java; :func:`unavailable`
says why not. The project, its Python and Spark may live anywhere, ``/tmp`` included (a CI's clone): a host
whose ``/tmp`` is its own gets each of them that lives under ``/tmp`` bind-mounted at the same path.
Everything started is ended by pid, and the namespaces, veths and bridge are removed, in :meth:`Cluster.stop`.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SUBNET = "198.18.0"
COORDINATOR_PORT = 7337
SERVICE_PORT = 7338  # the services' (``port`` in spark-defaults.conf); the coordinator is given its own
MASTER_PORT = 7077
PYTHON = sys.executable
TESTS = Path(__file__).resolve().parent
PROJECT = TESTS.parent
SPARK_HOME = Path(pyspark.__file__).resolve().parent
START_TIMEOUT = 180.0  # s for a JVM or a service to come up on a loaded 2-core machine
STOP_TIMEOUT = 20.0
STALE_AFTER = 600.0  # s: a namespace of another run with no process in it this long is a leftover


class HostError(RuntimeError):
    """A host, or a process on it, could not be made or did not come up."""


def unavailable() -> str | None:
    """Why hosts cannot be built here (None when they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building hosts from network namespaces needs root"
    for tool in ("ip", "unshare", "nsenter", "openssl", "java"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    probe = f"sfxprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        mount = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--uts", "--mount", "--propagation",
                                "private", "sh", "-c", "mount -t tmpfs tmpfs /tmp && hostname probe"],
                               capture_output=True, text=True, timeout=30)
        if mount.returncode != 0:
            return f"cannot give a namespace its own mounts and host name: {mount.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def carried_into_hosts() -> list[Path]:
    """What every host needs from this machine's ``/tmp``, which its own replaces: the project, the
    interpreter's environment and Spark when they live there (outermost paths only)."""
    wanted = [PROJECT, Path(sys.prefix), Path(PYTHON).parent, Path(PYTHON).resolve().parent, SPARK_HOME]
    under = sorted({p for p in wanted if p.is_relative_to("/tmp") and p != Path("/tmp")}, key=lambda p: len(p.parts))
    outermost: list[Path] = []
    for path in under:
        if not any(path.is_relative_to(kept) for kept in outermost):
            outermost.append(path)
    return outermost


def wait_for(what: str, check, timeout: float = START_TIMEOUT, interval: float = 0.25):
    """Poll ``check()`` until it returns something truthy; a HostError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise HostError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def _sh(*args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise HostError(f"{' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@dataclass
class Host:
    index: int
    name: str
    ip: str
    netns: str
    veth: str
    dir: Path
    holder: subprocess.Popen | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # what we started here, by role
    info: dict = field(default_factory=dict)  # its exchange service's addresses, as it printed them

    @property
    def conf_dir(self) -> Path:
        return self.dir / "conf"

    def env(self, spark: bool = False, **extra: str) -> dict[str, str]:
        """A process's environment on this host: this host's Spark conf directory, the project's Python.
        ``spark``: Spark's own processes and applications also get SPARK_LOCAL_IP (spark-env.sh's)."""
        drop = ("SPARKFLOW_EXCHANGE_RUNTIME_DIR", "SPARKFLOW_EXCHANGE_CONF", "SPARK_LOCAL_IP", "SPARK_CONF_DIR",
                "PYSPARK_SUBMIT_ARGS", "SPARK_REMOTE")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(SPARK_HOME=str(SPARK_HOME), SPARK_CONF_DIR=str(self.conf_dir), PYSPARK_PYTHON=PYTHON,
                   PYSPARK_DRIVER_PYTHON=PYTHON, SPARK_DAEMON_MEMORY="256m",
                   PATH=f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONPATH=os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p))
        if spark:
            env["SPARK_LOCAL_IP"] = self.ip
        env.update(extra)
        return env

    def command(self, args: list[str]) -> list[str]:
        """``args`` run inside this host (its network, host name and mounts)."""
        if self.holder is None:
            raise HostError(f"{self.name} is not up")
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-u", "-m", "--", *args]

    def start(self, role: str, args: list[str], *, spark: bool = False) -> subprocess.Popen:
        """A long-running process on this host; its output goes to ``<dir>/<role>.log``, stdout alone to
        ``<role>.out``. nsenter execs the command: the pid is the process's own."""
        out = open(self.dir / f"{role}.out", "wb")
        err = open(self.dir / f"{role}.log", "wb")
        proc = subprocess.Popen(self.command(args), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=self.env(spark=spark), cwd=self.dir, start_new_session=True)
        out.close()
        err.close()
        self.procs[role] = proc
        return proc

    def run(self, args: list[str], *, timeout: float, spark: bool = False) -> subprocess.CompletedProcess:
        """A command on this host, waited for (killed after ``timeout``)."""
        return subprocess.run(self.command(args), capture_output=True, text=True, timeout=timeout,
                              env=self.env(spark=spark), cwd=self.dir, stdin=subprocess.DEVNULL)

    def log(self, role: str) -> str:
        return _tail(self.dir / f"{role}.log")


class Cluster:
    """``hosts`` hosts: host0 runs Spark's master, the coordinator and the applications; the others a Spark
    worker and an exchange service each."""

    def __init__(self, hosts: int = 3, root: Path | None = None, worker_cores: int = 2,
                 worker_memory: str = "1g", keep: bool = False, jar: Path | None = None) -> None:
        """``root``: where hosts keep their files (outside /tmp; default a fresh directory in /var/tmp,
        removed by :meth:`stop` unless ``keep``); ``jar``: the Spark plugin (default the package's)."""
        self.jar = jar
        self.keep = keep or root is not None
        self.root = root or Path(tempfile.mkdtemp(prefix="sparkflow-multihost-", dir="/var/tmp"))
        self.tag = tag = f"{os.getpid() % 100000:05d}"
        self.bridge = f"sfx{tag}br"
        self.hosts = [Host(i, f"host{i}", f"{SUBNET}.{i + 1}", f"sfx{tag}h{i}", f"sfx{tag}v{i}", self.root / f"host{i}")
                      for i in range(hosts)]
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.etc = self.root / "etc"  # the files every host has at the same path (an operator's /etc/sparkflow)
        self.secret_file = self.etc / "secret"
        self.tls = {"ca": self.etc / "tls" / "ca.pem", "cert": self.etc / "tls" / "service.pem",
                    "key": self.etc / "tls" / "service.key"}
        self.state_dir = self.root / "coordinator-state"
        self.made_netns: list[str] = []
        self.made_links: list[str] = []

    # ------------------------------------------------------------ addresses
    @property
    def coordinator(self) -> str:
        return f"{self.hosts[0].ip}:{COORDINATOR_PORT}"

    @property
    def master(self) -> str:
        return f"spark://{self.hosts[0].ip}:{MASTER_PORT}"

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    # ------------------------------------------------------------ building
    def start(self) -> "Cluster":
        """Network, hosts, secret, TLS, configuration, Spark, services; stops what it made on any failure."""
        sweep_stale(self.tag)
        try:
            self._network()
            for host in self.hosts:
                self._holder(host)
            self._secret_and_tls()
            for host in self.hosts:
                self._spark_defaults(host)
            self._spark()
            self.start_service(self.hosts[0])
            for host in self.workers:
                self.start_service(host)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made_links.append(self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for host in self.hosts:
            _sh("ip", "netns", "add", host.netns)
            self.made_netns.append(host.netns)
            _sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            self.made_links.append(host.veth)
            _sh("ip", "link", "set", host.veth, "master", self.bridge)
            _sh("ip", "link", "set", host.veth, "up")
            for args in (("addr", "add", f"{host.ip}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                         ("link", "set", "lo", "up")):
                _sh("ip", "-n", host.netns, *args)

    def _holder(self, host: Host) -> None:
        host.dir.mkdir(parents=True, exist_ok=True)
        hosts_file = host.dir / "hosts"
        # only itself, by name (at 127.0.1.1, as Debian does): the other hosts are addresses, never names
        hosts_file.write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n::1 localhost\n")
        # a /tmp of its own; what it needs from this machine's /tmp (a clone there) is bound back at the same
        # path through a view of the old /tmp kept aside a moment (only in this host's mount namespace)
        outer = host.dir / "outer-tmp"
        outer.mkdir(exist_ok=True)
        carried = "".join(f" && mkdir -p {shlex.quote(str(p))} && mount --rbind "
                          f"{shlex.quote(str(outer / p.relative_to('/tmp')))} {shlex.quote(str(p))}"
                          for p in carried_into_hosts())
        script = (f"hostname {host.name} && mount --bind {shlex.quote(str(hosts_file))} /etc/hosts"
                  f" && mount --rbind /tmp {shlex.quote(str(outer))}"
                  f" && mount -t tmpfs -o mode=1777 tmpfs /tmp{carried} && umount -l {shlex.quote(str(outer))}"
                  " && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && echo ready && exec sleep infinity")
        host.holder = subprocess.Popen(["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount",
                                        "--propagation", "private", "sh", "-c", script],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                       text=True, start_new_session=True)
        line = host.holder.stdout.readline()  # "ready", or EOF when the script failed
        if line.strip() != "ready":
            raise HostError(f"{host.name}: holder failed: {host.holder.stderr.read()[-2000:]}")

    def _secret_and_tls(self) -> None:
        (self.etc / "tls").mkdir(parents=True, exist_ok=True)
        os.chmod(self.etc, 0o700)
        self.secret_file.write_text(os.urandom(24).hex() + "\n")
        os.chmod(self.secret_file, 0o600)
        tls = self.etc / "tls"
        san = ",".join(f"IP:{h.ip}" for h in self.hosts)
        _sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tls / "ca.key"),
            "-out", str(self.tls["ca"]), "-days", "2", "-subj", "/CN=sparkflow test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            timeout=60)
        _sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.tls["key"]),
            "-out", str(tls / "service.csr"), "-subj", "/CN=sparkflow-exchange service", timeout=60)
        (tls / "ext.cnf").write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                                     "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                     "extendedKeyUsage=serverAuth\n")
        _sh("openssl", "x509", "-req", "-in", str(tls / "service.csr"), "-CA", str(self.tls["ca"]),
            "-CAkey", str(tls / "ca.key"), "-CAcreateserial", "-out", str(self.tls["cert"]), "-days", "2",
            "-extfile", str(tls / "ext.cnf"), timeout=60)
        os.chmod(self.tls["key"], 0o600)

    def spark_defaults(self, host: Host) -> str:
        """The cluster's spark-defaults.conf, the same on every host: the plugin attaches each executor to
        its host's service, readers reach every host's at the TCP address it advertises."""
        import sparkflow_exchange

        lines = [
            f"spark.master {self.master}",
            f"spark.jars {self.jar or sparkflow_exchange.plugin_jar()}",
            "spark.plugins org.sparkflow.exchange.ExchangePlugin",
            f"spark.pyspark.python {PYTHON}",
            f"spark.pyspark.driver.python {PYTHON}",
            "spark.ui.enabled false",
            "spark.driver.memory 512m",
            "spark.executor.memory 512m",
            f"spark.executor.cores {self.worker_cores}",
            f"spark.cores.max {self.worker_cores * len(self.workers)}",
            "spark.scheduler.minRegisteredResourcesRatio 1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime 120s",
            "spark.sql.shuffle.partitions 4",
            "spark.sql.session.timeZone UTC",
            "spark.task.maxFailures 2",
            f"spark.sparkflow.exchange.coordinator {self.coordinator}",
            "spark.sparkflow.exchange.bindHost 0.0.0.0",
            f"spark.sparkflow.exchange.port {SERVICE_PORT}",
            f"spark.sparkflow.exchange.secretFile {self.secret_file}",
            f"spark.sparkflow.exchange.tls.certFile {self.tls['cert']}",
            f"spark.sparkflow.exchange.tls.keyFile {self.tls['key']}",
            f"spark.sparkflow.exchange.tls.caFile {self.tls['ca']}",
            "spark.sparkflow.exchange.tls.checkHostname true",
        ]
        return "\n".join(lines) + "\n"

    def _spark_defaults(self, host: Host) -> None:
        host.conf_dir.mkdir(parents=True, exist_ok=True)
        (host.conf_dir / "spark-defaults.conf").write_text(self.spark_defaults(host))

    def _spark(self) -> None:
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        master = self.hosts[0]
        master.start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", master.ip,
                                "--port", str(MASTER_PORT), "--webui-port", "8080"], spark=True)
        wait_for("Spark master up", lambda: self._alive(master, "master") and "I have been elected leader"
                 in master.log("master"))
        for host in self.workers:
            (host.dir / "work").mkdir(exist_ok=True)
            host.start("worker", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", host.ip,
                                  "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                                  "--work-dir", str(host.dir / "work"), "--webui-port", "8081", self.master],
                       spark=True)
        for host in self.workers:
            wait_for(f"Spark worker on {host.name} registered", lambda h=host: self._alive(h, "worker") and
                     "Successfully registered with master" in h.log("worker"))

    def _alive(self, host: Host, role: str) -> bool:
        proc = host.procs.get(role)
        if proc is not None and proc.poll() is not None:
            raise HostError(f"{role} on {host.name} exited ({proc.returncode}): {host.log(role)}")
        return proc is not None

    # ------------------------------------------------------------ exchange services
    def service_args(self, host: Host) -> list[str]:
        """``sparkflow-exchange serve`` as an operator runs it: every setting from spark-defaults.conf."""
        args = [str(Path(PYTHON).parent / "sparkflow-exchange"), "serve"]
        if host.index > 0:
            return [*args, "--no-coordinator"]
        return [*args, "--port", str(COORDINATOR_PORT), "--state-dir", str(self.state_dir)]

    def start_service(self, host: Host) -> dict:
        """Start the host's service; its addresses (the JSON line it prints) once it listens."""
        role = "service"
        (host.dir / f"{role}.out").write_bytes(b"")
        host.start(role, self.service_args(host))

        def started() -> dict | None:
            self._alive(host, role)
            for line in _tail(host.dir / f"{role}.out", 100_000).splitlines():
                if line.startswith("{"):
                    return json.loads(line)
            return None
        info = wait_for(f"exchange service on {host.name}", started)
        host.info = info
        return info

    def kill_service(self, host: Host, sig: int = signal.SIGKILL) -> None:
        proc = host.procs.pop("service")
        os.kill(proc.pid, sig)
        proc.wait(STOP_TIMEOUT)

    # ------------------------------------------------------------ applications
    def app(self, *args: str, timeout: float = 900.0, host: Host | None = None) -> tuple[dict, subprocess.CompletedProcess]:
        """Run ``tests/app_multihost.py args`` as a Spark application on ``host`` (host0), configured by that
        host's spark-defaults.conf alone; its last stdout line as JSON (None when it printed none)."""
        proc = (host or self.hosts[0]).run([PYTHON, str(TESTS / "app_multihost.py"), *args], timeout=timeout,
                                           spark=True)
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        try:
            result = json.loads(last)
        except ValueError:
            result = None
        return result, proc

    # ------------------------------------------------------------ teardown
    def stop(self) -> None:
        """End every process started here (services, workers, master, then anything left in a host's network
        namespace: executors and Python workers they started), by pid; remove namespaces, veths, bridge."""
        for host in reversed(self.hosts):
            for role in ("service", "worker", "master"):
                proc = host.procs.pop(role, None)
                if proc is not None:
                    _end(proc.pid, proc)
        for host in self.hosts:
            if host.netns in self.made_netns:
                left = _sh("ip", "netns", "pids", host.netns, check=False).stdout.split()
                holder = host.holder.pid if host.holder else None
                for pid in (int(p) for p in left if p.isdigit() and int(p) != holder):
                    _end(pid)
            if host.holder is not None:
                _end(host.holder.pid, host.holder)
                host.holder = None
        for netns in self.made_netns:
            _sh("ip", "netns", "del", netns, check=False)
        for link in reversed(self.made_links):  # a veth usually went with its namespace
            if _sh("ip", "link", "show", link, check=False).returncode == 0:
                _sh("ip", "link", "del", link, check=False)
        self.made_netns.clear()
        self.made_links.clear()
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def diagnostics(self) -> str:
        """The end of every host's service log (for a failed test's message)."""
        return "\n".join(f"--- {h.name} service.log:\n{_tail(h.dir / 'service.log', 3000)}" for h in self.hosts)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def sweep_stale(current: str) -> list[str]:
    """Remove what an earlier run killed before its teardown left (its namespaces, veths and bridge), when
    no process runs in any of its namespaces any more and they are older than STALE_AFTER (a run starting
    at this moment has namespaces without processes for a moment); the names removed."""
    import re

    runs: dict[str, list[str]] = {}
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        found = re.match(r"(sfx(\d{5})h\d+)\b", line)
        if found and found.group(2) != current:
            runs.setdefault(found.group(2), []).append(found.group(1))
    removed = []
    for tag, names in runs.items():
        if any(_sh("ip", "netns", "pids", name, check=False).stdout.split() for name in names):
            continue  # something still runs there: not ours to end
        if any(_age(Path("/run/netns") / name) < STALE_AFTER for name in names):
            continue
        for name in names:
            _sh("ip", "netns", "del", name, check=False)
        links = _sh("ip", "-o", "link", "show", check=False).stdout
        for link in sorted(set(re.findall(rf"\d+: (sfx{tag}(?:br|v\d+))[@:]", links))):
            _sh("ip", "link", "del", link, check=False)
        removed += names
    return removed


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _end(pid: int, proc: subprocess.Popen | None = None) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT: the process ``pid`` only."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(STOP_TIMEOUT)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True
