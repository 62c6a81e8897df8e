"""Services and applications under different users, as docs/deployment.md sets them up: the service runs as its
own user in a shared group, the secret file is that group's to read (0640), the socket's directory is the group's
to enter (0750) and the socket, with ``unixSocketGroup``, the group's to connect to (0660). An application of
another user in the group writes and reads through it; a user outside the group can neither read the secret nor
reach the socket. The users and group are created for the test (root only) and removed after it."""
from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sparkflow_exchange.network.listener import unix_socket

NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("useradd", "groupadd", "userdel", "groupdel", "setpriv")),
    reason="creating throwaway users needs root and useradd/groupadd/setpriv")

CLIENT = r"""
import json, sys
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
print(json.dumps({"rows": len(values), "exact": values == list(range(1000))}))
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


def _as(user: str, home: Path, *argv: str) -> dict:
    """Run ``python`` as ``user`` with the user's groups (setpriv), its JSON line."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME")}
    env.update(HOME=str(home), SPARKFLOW_EXCHANGE_RUNTIME_DIR=str(home / "runtime"))
    proc = subprocess.run(["setpriv", "--reuid", user, "--regid", user, "--init-groups", sys.executable, *argv],
                          capture_output=True, text=True, timeout=300, cwd=home, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@NEEDS_ROOT
def test_an_application_of_another_user_in_the_services_group_uses_it_and_an_outsider_cannot(accounts):
    group = grp.getgrnam(accounts["group"]).gr_gid
    svc = pwd.getpwnam(accounts["svc"]).pw_uid
    base = Path(tempfile.mkdtemp(prefix="sfx-two-users-", dir="/tmp"))
    proc = None
    try:
        os.chmod(base, 0o755)
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
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "SPARK_HOME")}
        env.update(HOME=str(homes["svc"]), SPARKFLOW_EXCHANGE_RUNTIME_DIR=str(homes["svc"] / "runtime"))
        log = open(homes["svc"] / "service.log", "wb")
        proc = subprocess.Popen(
            ["setpriv", "--reuid", accounts["svc"], "--regid", accounts["group"], "--init-groups", sys.executable,
             "-m", "sparkflow_exchange.service", "--host", "127.0.0.1", "--port", "0", "--host-id", "two-users",
             "--secret-file", str(secret), "--spill-dir", str(homes["svc"] / "spill"), "--unix", str(sock),
             "--conf", "unixSocketGroup=true"],
            stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=homes["svc"])
        line, deadline = "", time.monotonic() + 60
        while not line.strip() and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert line.strip(), (homes["svc"] / "service.log").read_text()[-3000:]
        st = os.stat(sock)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (svc, group, 0o660)

        result = _as(accounts["app"], homes["app"], "-c", CLIENT, f"unix:{sock}", str(secret))
        assert result == {"rows": 1000, "exact": True}
        outside = _as(accounts["outsider"], homes["outsider"], "-c", PROBE, str(sock), str(secret))
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
