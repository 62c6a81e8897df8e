"""Services and applications under different users, as docs/deployment.md sets them up: the service runs as its
own user in a shared group, the secret file is that group's to read (0640), the socket's directory is the group's
to enter (0750) and the socket, with ``unixSocketGroup``, the group's to connect to (0660). An application of
another user in the group writes and reads through it; a user outside the group can neither read the secret nor
reach the socket. The users and group are created for the test (root only) and removed after it.

Those users run the package from a copy the test makes for them (an interpreter they may execute, the package and
the libraries it imports, in a directory they may read), not from the checkout: a checkout in a home directory
(0700) is closed to other users, as a deployment's installation is not."""
from __future__ import annotations

import grp
import importlib.metadata
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

import sparkflow_exchange
from sparkflow_exchange.network.listener import unix_socket

NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("useradd", "groupadd", "userdel", "groupdel", "setpriv")),
    reason="creating throwaway users needs root and useradd/groupadd/setpriv")

CLIENT = r"""
import json, os, sys
import pyarrow as pa
from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.config import ExchangeConfig

sock, secret_file = sys.argv[1], sys.argv[2]
cfg = ExchangeConfig.load({"coordinator": sock, "service": sock, "secretFile": secret_file, "exchange": "shared",
                           "keys": "a", "numSubpartitions": "2"}, spark_conf={})
schema = pa.schema([pa.field("a", pa.int64())])
handle = ex.declare_write(cfg, schema, overwrite=True)
task = ex.ProducerTask(handle, 0, "a0")
task.write([pa.record_batch([pa.array(range(1000))], schema=schema)])
wh.commit_write(handle, [task.finish()["partition"]])
desc = ex.describe_exchange(cfg)
values = sorted(v for s in range(2) for b in ex.read_subpartition(cfg, desc, s) for v in b.column(0).to_pylist())
print(json.dumps({"rows": len(values), "exact": values == list(range(1000)), "package": os.path.dirname(ex.__file__)}))
"""

# what the service and the client import: the libraries the users' copy must hold
IMPORTS = r"""
import json, sys
before = set(sys.modules)
import pyarrow, sparkflow_exchange.service.main, sparkflow_exchange.exchange, sparkflow_exchange.write_handle
print(json.dumps(sorted({name.partition(".")[0] for name in set(sys.modules) - before})))
"""

PROBE = r"""
import json, socket, sys
out = {}
try:
    open(sys.argv[2]).read()
    out["secret"] = "read"
except OSError as exc:
    out["secret"] = type(exc).__name__
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    out["socket"] = "connected"
except OSError as exc:
    out["socket"] = type(exc).__name__
print(json.dumps(out))
"""


def test_the_socket_is_its_users_alone_unless_its_group_may_connect(tmp_path):
    for group, mode in ((False, 0o600), (True, 0o660)):
        path = tmp_path / f"s-{mode:o}.sock"
        with unix_socket(str(path), group=group):
            assert stat.S_IMODE(os.stat(path).st_mode) == mode


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def _open_to_others(path: Path) -> bool:
    """Whether every directory on the way to ``path`` (and ``path``) lets other users through."""
    path = path.resolve()
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _interpreter_for(user: str) -> str | None:
    """A Python of this version (the compiled libraries' ABI) that ``user`` may execute, with its standard library:
    this interpreter's, else the system's of the same version. None when there is none."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [os.path.realpath(sys.executable), os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  shutil.which(f"python{version}"), f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
    want = json.dumps([sys.implementation.cache_tag, sys.maxsize])
    for candidate in dict.fromkeys(c for c in candidates if c and os.path.isfile(c)):
        probe = subprocess.run(["setpriv", "--reuid", user, "--regid", user, "--init-groups", candidate, "-I", "-c",
                                "import json, sys; print(json.dumps([sys.implementation.cache_tag, sys.maxsize]))"],
                               capture_output=True, text=True, timeout=60, cwd="/")
        if probe.returncode == 0 and probe.stdout.strip() == want:
            return candidate
    return None


def _place(src: Path, dst: Path) -> None:
    """``src`` at ``dst``, readable (and, if it is, executable) by every user: a hard link when its mode already lets
    others read it, else a copy made so (with its modification time, so its compiled bytecode stays valid)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    st = os.stat(src)
    mode = st.st_mode
    executable = mode & stat.S_IXUSR
    if mode & stat.S_IROTH and (not executable or mode & stat.S_IXOTH):
        try:
            os.link(src, dst)
            return
        except OSError:  # another file system, or links refused
            pass
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755 if executable else 0o644)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def _library_root(top: str) -> Path | None:
    """The path entry the top-level module ``top`` is imported from; None for the standard library's, and for a
    module without a file (one Cython's compiled modules register for their shared runtime has no spec at all)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):  # built in, frozen
        return None
    origin = Path(spec.origin).resolve()
    entries = sorted({Path(p).resolve() for p in sys.path if p and os.path.isdir(p)}, key=lambda p: -len(p.parts))
    root = next((e for e in entries if e in origin.parents), None)
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    if root is None or (root.name not in ("site-packages", "dist-packages") and (root == stdlib or stdlib in root.parents)):
        return None
    return root


def _readable_copy(dest: Path) -> Path:
    """The package and the libraries its service and client import (each one's installed files), under ``dest``, in
    directories every user may read: the directory to put on their ``PYTHONPATH``."""
    site = dest / "site"
    package = Path(sparkflow_exchange.__file__).resolve().parent
    for src in package.rglob("*"):
        if src.is_file():
            _place(src, site / package.name / src.relative_to(package))
    tops = json.loads(subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=120,
                                     check=True).stdout.strip().splitlines()[-1])
    owners = importlib.metadata.packages_distributions()
    for top in tops:
        root = _library_root(top)
        if top == package.name or root is None:
            continue
        files = [os.path.normpath(root / str(entry)) for dist in owners.get(top, ())
                 for entry in importlib.metadata.distribution(dist).files or ()]
        if not files:  # no installation record: the module's own file or directory
            spec = importlib.util.find_spec(top)
            found = [Path(p) for p in spec.submodule_search_locations or ()] or [Path(spec.origin)]
            files = [str(f) for p in found for f in ([p] if p.is_file() else p.rglob("*"))]
        prefix = str(root) + os.sep
        for src in files:  # the distribution's files inside its path entry (not its scripts)
            if src.startswith(prefix) and os.path.isfile(src):
                _place(Path(src), site / src[len(prefix):])
    for d in (dest, *(p for p in dest.rglob("*") if p.is_dir())):
        os.chmod(d, 0o755)
    return site


@pytest.fixture
def accounts():
    """A shared group, the service's user (in it), an application's user (in it) and an outsider; removed after."""
    tag = secrets.token_hex(3)
    group, svc, app, outsider = f"sfxg{tag}", f"sfxs{tag}", f"sfxa{tag}", f"sfxo{tag}"
    made: list[str] = []
    try:
        _run("groupadd", "--system", group)
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--gid", group, svc)
        made.append(svc)
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group",
             "--groups", group, app)
        made.append(app)
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", outsider)
        made.append(outsider)
        yield {"group": group, "svc": svc, "app": app, "outsider": outsider}
    finally:
        for user in made:
            subprocess.run(["userdel", user], capture_output=True, timeout=60)
            subprocess.run(["groupdel", user], capture_output=True, timeout=60)  # a private group userdel left
        subprocess.run(["groupdel", group], capture_output=True, timeout=60)


def _env(home: Path, site: Path) -> dict[str, str]:
    """A user's environment: its home, its runtime directory, the readable copy as the only extra path."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME", "PYTHONPATH", "PYTHONHOME")}
    env.update(HOME=str(home), SPARKFLOW_EXCHANGE_RUNTIME_DIR=str(home / "runtime"), PYTHONPATH=str(site),
               PYTHONNOUSERSITE="1")
    return env


def _as(user: str, home: Path, python: str, site: Path, *argv: str) -> dict:
    """Run ``python`` as ``user`` with the user's groups (setpriv), its JSON line."""
    proc = subprocess.run(["setpriv", "--reuid", user, "--regid", user, "--init-groups", python, *argv],
                          capture_output=True, text=True, timeout=300, cwd=home, env=_env(home, site))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@NEEDS_ROOT
def test_an_application_of_another_user_in_the_services_group_uses_it_and_an_outsider_cannot(accounts):
    group = grp.getgrnam(accounts["group"]).gr_gid
    svc = pwd.getpwnam(accounts["svc"]).pw_uid
    if not _open_to_others(Path("/tmp")):
        pytest.skip("/tmp is closed to other users: the throwaway users could not reach their files there")
    python = _interpreter_for(accounts["outsider"])
    if python is None:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        pytest.skip(f"no Python {version} that another user may execute: neither {os.path.realpath(sys.executable)} "
                    f"nor a system python{version} runs for them (a directory on its way is closed to other users, as "
                    "a home directory is, or there is none)")
    base = Path(tempfile.mkdtemp(prefix="sfx-two-users-", dir="/tmp"))
    proc = None
    try:
        os.chmod(base, 0o755)
        site = _readable_copy(base / "code")
        homes = {}
        for who in ("svc", "app", "outsider"):
            home = base / who
            home.mkdir(mode=0o700)
            entry = pwd.getpwnam(accounts[who])
            os.chown(home, entry.pw_uid, entry.pw_gid)
            homes[who] = home
        # as the unit sets them up: /etc/sparkflow/secret root-or-service owned, the group's to read (0640);
        # RuntimeDirectory=sparkflow-exchange with RuntimeDirectoryMode=0750 and Group=
        secret = base / "secret"
        secret.write_text(secrets.token_hex(32))
        os.chown(secret, svc, group)
        os.chmod(secret, 0o640)
        run_dir = base / "run"
        run_dir.mkdir()
        os.chown(run_dir, svc, group)
        os.chmod(run_dir, 0o750)
        sock = run_dir / "service.sock"
        log = open(homes["svc"] / "service.log", "wb")
        proc = subprocess.Popen(
            ["setpriv", "--reuid", accounts["svc"], "--regid", accounts["group"], "--init-groups", python,
             "-m", "sparkflow_exchange.service", "--host", "127.0.0.1", "--port", "0", "--host-id", "two-users",
             "--secret-file", str(secret), "--spill-dir", str(homes["svc"] / "spill"), "--unix", str(sock),
             "--conf", "unixSocketGroup=true"],
            stdout=subprocess.PIPE, stderr=log, text=True, env=_env(homes["svc"], site), cwd=homes["svc"])
        line, deadline = "", time.monotonic() + 60
        while not line.strip() and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert line.strip(), (homes["svc"] / "service.log").read_text()[-3000:]
        st = os.stat(sock)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (svc, group, 0o660)

        result = _as(accounts["app"], homes["app"], python, site, "-c", CLIENT, f"unix:{sock}", str(secret))
        assert result == {"rows": 1000, "exact": True, "package": str(site / "sparkflow_exchange")}
        outside = _as(accounts["outsider"], homes["outsider"], python, site, "-c", PROBE, str(sock), str(secret))
        assert outside == {"secret": "PermissionError", "socket": "PermissionError"}
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)
