"""Owners: an exchange belongs to the credential that declared it (docs/deployment.md, credentials and owners).

One real service with its own secret (the operator credential) and two application credentials from its
``credentialsFile``: the second application cannot drop, release, overwrite, append to, commit or abort
the first one's exchange, nor stop the service; it can read it; the owner and the operator can do all.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from harness import client_config, start_service
from sparkflow_exchange import exchange as ex
from sparkflow_exchange.errors import ExchangeError
from sparkflow_exchange.network.blocking_client import ServiceError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
SECRETS = {"app-a": "secret-of-a-0123456789", "app-b": "secret-of-b-0123456789"}
REFUSED = (ExchangeError, ServiceError)


@pytest.fixture
def shared(tmp_path):
    """A service shared by two applications (and its operator)."""
    creds = tmp_path / "credentials"
    creds.write_text("# name secret\n" + "".join(f"{n} {s}\n" for n, s in SECRETS.items()))
    creds.chmod(0o600)
    svc = start_service(tmp_path / "svc", conf={"credentialsFile": str(creds)})
    yield svc
    svc.stop()


def as_(svc, who: str, name: str = "orders", **kw):
    secret = svc.secret if who == "operator" else SECRETS[who]
    opts = dict(exchange=name, partitioner="hash", keys="id", numSubpartitions=2, partitionType="HYBRID",
                secret=secret, hostId="elsewhere", readerTimeout="30s")
    opts.update(kw)
    return client_config(svc, **opts)


def write(config, rows: int, overwrite: bool = True) -> ex.WriteHandle:
    handle = ex.declare_write(config, SCHEMA, overwrite=overwrite)
    task = ex.ProducerTask(handle, 0, "t0")
    task.write([pa.record_batch([pa.array(np.arange(rows, dtype=np.int64))], schema=SCHEMA)])
    ex.commit_write(handle, [task.finish()["partition"]])
    return handle


def rows_of(config) -> int:
    desc = ex.describe_exchange(config)
    return sum(b.num_rows for sub in range(2) for b in ex.read_subpartition(config, desc, sub))


def test_another_credential_can_read_but_not_change_an_exchange(shared):
    a, b = as_(shared, "app-a"), as_(shared, "app-b")
    write(a, 1000)
    assert ex.describe_exchange(b)["owner"] == "app-a"
    assert rows_of(b) == 1000  # every credential may read every exchange

    with pytest.raises(REFUSED, match="belongs to credential 'app-a'.*authenticated as 'app-b'"):
        ex.drop_exchange("orders", b)
    with pytest.raises(REFUSED, match="belongs to credential 'app-a'"):
        ex.declare_write(b, SCHEMA, overwrite=True)
    with pytest.raises(REFUSED, match="belongs to credential 'app-a'"):
        ex.declare_write(b, SCHEMA, overwrite=False)  # an append changes it too
    assert rows_of(a) == 1000 and ex.describe_exchange(a)["owner"] == "app-a"


def test_another_credential_cannot_commit_abort_or_join_a_write(shared):
    a, b = as_(shared, "app-a"), as_(shared, "app-b")
    handle = ex.declare_write(a, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "t0")
    task.write([pa.record_batch([pa.array(np.arange(100, dtype=np.int64))], schema=SCHEMA)])
    part = task.finish()["partition"]
    theirs = ex.WriteHandle(b, handle.name, handle.epoch, handle.write_id, handle.schema_b64,
                            handle.num_subpartitions, handle.partitioner)
    with pytest.raises(REFUSED, match="aborting a write of exchange 'orders' is refused"):
        from sparkflow_exchange.calls import call

        call(b, "abort", name="orders", epoch=handle.epoch, write_id=handle.write_id, reason="mischief")
    with pytest.raises(REFUSED, match="committing a write of exchange 'orders' is refused"):
        ex.commit_write(theirs, [part])
    with pytest.raises(REFUSED, match="writing exchange 'orders' is refused"):
        ex.ProducerTask(theirs, 1, "t1")
    ex.commit_write(handle, [part])
    assert rows_of(b) == 100


def test_another_credential_cannot_release_partitions_or_stop_the_service(shared):
    a, b = as_(shared, "app-a"), as_(shared, "app-b")
    write(a, 500)
    partitions = [p["partition"] for p in shared.status()["partitions"]]
    with shared.connect(secret=SECRETS["app-b"]) as conn:
        with pytest.raises(ServiceError, match="releasing partitions by id needs the operator credential"):
            conn.call("release_partitions", partitions=partitions, reason="mischief")
        with pytest.raises(ServiceError, match="stopping the service needs the operator credential"):
            conn.call("shutdown")
        with pytest.raises(ServiceError, match="needs the operator credential"):
            conn.call("attach_app", app="app-x", pid=1)
        assert conn.call("ping")["service_id"]  # still served
    assert shared.proc.poll() is None
    assert rows_of(b) == 500


def test_the_owner_and_the_operator_may_change_it(shared):
    a, op = as_(shared, "app-a"), as_(shared, "operator")
    write(a, 10)
    write(a, 20, overwrite=False)  # the owner appends
    assert rows_of(a) == 30
    ex.drop_exchange("orders", a)  # the owner drops
    write(a, 10)
    write(op, 40)  # the operator overwrites: the new exchange is the operator's
    assert ex.describe_exchange(a)["owner"] == "operator"
    with pytest.raises(REFUSED, match="belongs to credential 'operator'"):
        ex.drop_exchange("orders", a)
    ex.drop_exchange("orders", op)
    with shared.connect() as conn:  # the service's own secret may stop it
        assert conn.call("shutdown") == {"ok": True}
    assert shared.proc.wait(30) == 0


def test_an_unknown_secret_is_refused(shared):
    with pytest.raises(REFUSED, match="wrong secret"):
        ex.list_exchanges(as_(shared, "app-a", secret="not-a-credential"))


@pytest.mark.parametrize("content,message", [
    ("app-a\n", "line 1: expected 'name secret', got 1 fields"),
    ("operator s3cret\n", "line 1: 'operator' is the name of the service's own secret"),
    ("x one\nx two\n", "line 2: credential 'x' is listed twice"),
    ("x same\ny same\n", "line 2: credential 'y' has the same secret as another credential"),
])
def test_a_bad_credentials_file_stops_the_service_with_a_clear_error(tmp_path, content, message):
    creds = tmp_path / "credentials"
    creds.write_text(content)
    creds.chmod(0o600)
    (tmp_path / "secret").write_text("operator-secret")
    (tmp_path / "secret").chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.service", "--port", "0",
                           "--secret-file", str(tmp_path / "secret"), "--spill-dir", str(tmp_path / "spill"),
                           "--conf", f"credentialsFile={creds}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
