"""A killed service leaves no disk behind for good: the next service on its spill root removes what it left,
never what a live neighbour holds, counts what it cannot remove, and says what is on disk."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from harness import client_config, start_service

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh
from sparkflow_exchange.service.spill_root import LOCK_NAME, SPILL_PREFIX, tree_bytes

SCHEMA = pa.schema([pa.field("id", pa.int64())])
ROWS = 200_000


def _write(svc, name: str, rows: int = ROWS) -> None:
    config = client_config(svc, exchange=name, partitioner="hash", keys="id", numSubpartitions="4",
                           partitionType="BLOCKING")
    handle = ex.declare_write(config, SCHEMA, overwrite=True)
    task = ex.ProducerTask(handle, 0, "a0")
    task.write([pa.record_batch([pa.array(range(rows))], schema=SCHEMA)])
    wh.commit_write(handle, [task.finish()["partition"]])


def _rows(svc, name: str) -> int:
    config = client_config(svc, exchange=name)
    desc = ex.describe_exchange(config)
    return sum(b.num_rows for sub in range(desc.num_subpartitions) for b in ex.read_subpartition(config, desc, sub))


def _kill(svc) -> Path:
    """kill -9 the service by its pid; its spill directory (with its data) stays behind."""
    os.kill(svc.proc.pid, signal.SIGKILL)
    svc.proc.wait(30)
    assert list(svc.spill_dir.glob("*.data")), "the killed service had written spill files"
    return svc.spill_dir


def _data_files(root: Path) -> set[Path]:
    return set(root.glob("*/*.data"))


def test_the_next_service_removes_what_killed_ones_left_and_a_live_neighbour_keeps_its_files(tmp_path):
    root = tmp_path / "spill"  # one spill root (spillDir) shared by every service on this host
    live = start_service(tmp_path / "live", spill=root)
    try:
        _write(live, "kept")
        kept_files = set(live.spill_dir.glob("*.data"))
        assert kept_files
        dead = []
        for i in range(2):  # two crashes, as a unit with Restart=on-failure would have
            svc = start_service(tmp_path / f"crashed{i}", spill=root)
            assert not any(d.exists() for d in dead)  # the restart after a crash removed what it left
            _write(svc, f"lost{i}")
            dead.append(_kill(svc))
        assert dead[-1].exists()

        new = start_service(tmp_path / "new", spill=root)
        try:
            assert not any(d.exists() for d in dead), "a dead service's spill directory was left"
            assert _data_files(root) == kept_files  # the live neighbour's files are all still there
            assert _rows(live, "kept") == ROWS  # ... and still read
            disk = new.status()["disk"]
            assert disk["leftover"] == 0 and disk["used"] == 0
            assert disk["root"] == str(root)
            assert disk["root_bytes"] == tree_bytes(live.spill_dir) + tree_bytes(new.spill_dir) > 0

            _write(new, "fresh")
            disk = new.status()["disk"]
            data = sum(p.stat().st_size for p in new.spill_dir.glob("*.data"))
            assert disk["used"] == data > 0  # what status says is held is what is on disk
            assert disk["on_disk"] >= data and disk["root_bytes"] >= data + sum(p.stat().st_size for p in kept_files)
            out = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--address", new.tcp,
                                  "--secret-file", str(new.home / "secret")], capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0, out.stderr
            assert f"{data / (1 << 20):.1f} of" in out.stdout and str(root) in out.stdout
        finally:
            assert new.stop() == 0
        assert not new.spill_dir.exists()
    finally:
        assert live.stop() == 0
    assert not live.spill_dir.exists()


def _pin(path: Path) -> None:
    """Make ``path``'s files impossible to remove for this user (immutable as root, a read-only directory else)."""
    if os.geteuid() == 0:
        victim = next(path.glob("*.data"))
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(victim)]).returncode != 0:
            pytest.skip("cannot make a file immutable here (chattr)")
    else:
        path.chmod(0o500)


def _unpin(path: Path) -> None:
    if os.geteuid() == 0:
        for victim in path.glob("*.data"):
            subprocess.run(["chattr", "-i", str(victim)])
    else:
        path.chmod(0o700)


def test_what_a_dead_service_left_and_cannot_be_removed_counts_against_max_disk_bytes(tmp_path):
    root = tmp_path / "spill"
    crashed = start_service(tmp_path / "crashed", spill=root)
    _write(crashed, "lost")
    dead = _kill(crashed)
    _pin(dead)
    try:
        left = tree_bytes(dead)
        new = start_service(tmp_path / "new", spill=root, conf={"maxDiskBytes": left + 4096})
        try:
            assert dead.exists()
            disk = new.status()["disk"]
            assert disk["leftover"] > 0 and disk["leftover_dirs"] == [str(dead)]
            assert disk["used"] == disk["leftover"]  # counted against maxDiskBytes
            with pytest.raises(Exception, match="maxDiskBytes"):  # no room left beside it
                _write(new, "more")
            log = (new.home / "service.log").read_text()
            assert str(dead) in log and "could not be removed" in log
            _unpin(dead)
            shutil.rmtree(dead)  # the operator removes it: it stops counting
            disk = new.status()["disk"]
            assert disk["leftover"] == 0 and disk["used"] == 0
            _write(new, "more")
        finally:
            assert new.stop() == 0
    finally:
        if dead.exists():
            _unpin(dead)


def test_a_directory_being_made_or_not_a_services_is_never_removed(tmp_path):
    root = tmp_path / "spill"
    root.mkdir(mode=0o700)
    mine = root / f"{SPILL_PREFIX}{os.getpid()}-beef"  # a live pid, no lock yet: a service being made
    mine.mkdir()
    foreign = root / f"{SPILL_PREFIX}1-cafe"  # a dead-looking pid, files and no lock: not a service's
    foreign.mkdir()
    (foreign / "notes.txt").write_text("someone else's")
    new = start_service(tmp_path / "new", spill=root)
    try:
        assert mine.exists() and (foreign / "notes.txt").exists()
        assert (new.spill_dir / LOCK_NAME).exists()
    finally:
        assert new.stop() == 0
