"""Local files: the runtime directory must be ours with mode 0700, nothing is opened through a planted
link, state files are believed only when ours with mode 0600, and the arena sweep follows no link."""
from __future__ import annotations

import json
import os

import pytest

from sparkflow_exchange.partition import shared_arena
from sparkflow_exchange.service import discovery
from sparkflow_exchange.service.launcher import read_state, write_state
from sparkflow_exchange.service.private_files import UnsafePathError, ensure_private_dir, open_private


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    path = tmp_path / "runtime"
    monkeypatch.setenv("SPARKFLOW_EXCHANGE_RUNTIME_DIR", str(path))
    return path


def test_runtime_dir_is_created_private(runtime):
    assert discovery.runtime_dir() == runtime
    assert oct(runtime.stat().st_mode & 0o777) == oct(0o700)


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_runtime_dir_with_loose_mode_is_refused(runtime, mode):
    runtime.mkdir(mode=mode)
    runtime.chmod(mode)  # e.g. made by someone else's umask, or world-writable on purpose
    with pytest.raises(UnsafePathError, match=rf"{runtime}.* has mode {mode:o}; it must be 700 \(chmod 700"):
        discovery.runtime_dir()


def test_runtime_dir_that_is_a_link_is_refused(runtime, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    runtime.symlink_to(target)
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        discovery.runtime_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_runtime_dir_of_another_user_is_refused(runtime):
    runtime.mkdir(mode=0o700)
    os.chown(runtime, 65534, 65534)
    with pytest.raises(UnsafePathError, match="belongs to uid 65534, not to you"):
        ensure_private_dir(runtime)


def _alive_state() -> dict:
    return {"pid": os.getpid(), "unix": "unix:/nowhere"}


def test_state_files_are_believed_only_when_private(runtime, tmp_path):
    state = ensure_private_dir(runtime) / "embedded.json"
    write_state(state, _alive_state())
    assert oct(state.stat().st_mode & 0o777) == oct(0o600)
    assert read_state(state) == _alive_state()
    state.chmod(0o644)  # readable by others: its secret may have leaked, and someone else may have written it
    assert read_state(state) is None
    state.unlink()
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps(_alive_state()))
    planted.chmod(0o600)
    state.symlink_to(planted)
    assert read_state(state) is None  # never read through a link
    if os.getuid() == 0:
        state.unlink()
        write_state(state, _alive_state())
        os.chown(state, 65534, 65534)
        assert read_state(state) is None


def test_writing_a_state_file_replaces_a_planted_link_not_its_target(runtime, tmp_path):
    state = ensure_private_dir(runtime) / "embedded.json"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    state.symlink_to(victim)
    write_state(state, _alive_state())
    assert victim.read_text() == "precious"
    assert not state.is_symlink() and read_state(state) == _alive_state()


def test_lock_and_log_files_are_not_opened_through_links(runtime, tmp_path):
    lock = ensure_private_dir(runtime) / "embedded.lock"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock.symlink_to(victim)
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        open_private(lock, os.O_RDWR)
    assert victim.read_text() == "precious"


@pytest.mark.skipif(not shared_arena.available(), reason="no usable /dev/shm")
def test_arena_sweep_follows_no_link(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = shared_arena.SHM_DIR / f"{shared_arena.PREFIX}{dead.pid}-11fe11"
    orphan = shared_arena.SHM_DIR / f"{shared_arena.PREFIX}{dead.pid}-0dd0dd"
    try:
        link.symlink_to(victim)
        orphan.write_bytes(b"x")
        if not shared_arena._NAME.fullmatch(orphan.name):
            pytest.skip("arena names have another shape")
        removed = shared_arena.sweep_orphan_arenas()
        assert orphan in removed and not orphan.exists()  # a dead writer's arena goes
        assert link not in removed and link.is_symlink() and victim.read_text() == "precious"
    finally:
        link.unlink(missing_ok=True)
        orphan.unlink(missing_ok=True)
