"""Three simulated hosts with Spark standalone and the exchange services, by hand (root, Linux).

    python scripts/multihost.py up      # build the cluster, print how to use it, tear it down on Ctrl-C
    python scripts/multihost.py test    # run tests/test_multihost.py against a fresh cluster

The cluster is tests/multihost.py's: host0 (198.18.0.1) runs Spark's master, the coordinator and the
applications; host1 and host2 a Spark worker and an exchange service each. Every process of a host runs
inside its namespaces: ``nsenter -t <holder pid> -n -u -m -- <command>``.
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import multihost  # noqa: E402


def up(args: argparse.Namespace) -> int:
    reason = multihost.unavailable()
    if reason:
        print(f"cannot build hosts here: {reason}", file=sys.stderr)
        return 2
    cluster = multihost.Cluster(hosts=args.hosts, keep=args.keep)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"building {args.hosts} hosts in {cluster.root} (a minute or two) ...", flush=True)
    cluster.start()
    try:
        print(f"Spark master {cluster.master}, coordinator {cluster.coordinator}")
        for host in cluster.hosts:
            print(f"  {host.name} {host.ip}: service {host.info.get('tcp')}, files {host.dir}")
            print(f"    shell: nsenter -t {host.holder.pid} -n -u -m -- env SPARK_CONF_DIR={host.conf_dir} bash")
        print(f"an application: python tests/app_multihost.py write NAME, inside host0 (SPARK_CONF_DIR={cluster.hosts[0].conf_dir})")
        print("Ctrl-C tears everything down.", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
    finally:
        print("tearing down ...", flush=True)
        cluster.stop()
    return 0


def test(args: argparse.Namespace) -> int:
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-rs", str(ROOT / "tests" / "test_multihost.py"),
                            *args.pytest_args], cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="build the cluster and keep it until Ctrl-C")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the hosts' files (logs, conf) after teardown")
    p.set_defaults(run=up)
    p = sub.add_parser("test", help="run tests/test_multihost.py")
    p.add_argument("pytest_args", nargs="*")
    p.set_defaults(run=test)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
