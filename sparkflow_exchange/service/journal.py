"""The coordinator's state directory (``stateDir``): what it must not forget when it restarts.

A coordinator run by the operator (``sparkflow-exchange serve`` with ``stateDir``) keeps its exchanges
(schema, width, partitioner, producers and which service holds each one's partition, what was
committed, the seals), the lost marks and its registry of services there. Each exchange is one
file, rewritten atomically (a fresh 0600 file, fsync'd, renamed over the old one, the directory
fsync'd) whenever the exchange reaches a state a read may see: declared, committed, aborted. A drop
removes it. So a kill -9 at any moment leaves every committed write on disk; a write still open at
that moment is aborted when the coordinator starts again (its producers' registrations were not
kept), and its job fails saying so. The directory is 0700 and must belong to the service's user.

Stream epochs are not kept: a stream is born again by its writer query.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..errors import StorageError

log = logging.getLogger(__name__)

EXCHANGES = "exchanges"
SERVICES = "services.json"
LOST = "lost.json"
FORMAT = 1


class Journal:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir)
        self.exchanges = self.root / EXCHANGES
        for directory in (self.root, self.exchanges):
            _private_dir(directory)

    # ------------------------------------------------------------ writing
    def save_exchange(self, name: str, data: dict[str, Any]) -> None:
        self._write(self._exchange_file(name), {"format": FORMAT, "name": name, "exchange": data})

    def remove_exchange(self, name: str) -> None:
        try:
            self._exchange_file(name).unlink()
        except FileNotFoundError:
            return
        _fsync_dir(self.exchanges)

    def save_services(self, records: list[dict[str, Any]]) -> None:
        self._write(self.root / SERVICES, {"format": FORMAT, "services": records})

    def save_lost(self, lost: dict[str, dict]) -> None:
        self._write(self.root / LOST, {"format": FORMAT, "lost": lost})

    # ------------------------------------------------------------ reading (at start)
    def load_exchanges(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.exchanges.glob("*.json")):
            data = self._read(path)
            if data is not None and isinstance(data.get("exchange"), dict):
                out.append(data["exchange"])
        return out

    def load_services(self) -> list[dict[str, Any]]:
        data = self._read(self.root / SERVICES) or {}
        return [r for r in data.get("services", []) if isinstance(r, dict)]

    def load_lost(self) -> dict[str, dict]:
        data = self._read(self.root / LOST) or {}
        lost = data.get("lost", {})
        return {k: v for k, v in lost.items() if isinstance(v, dict) and "message" in v} if isinstance(lost, dict) else {}

    # ------------------------------------------------------------ files
    def _exchange_file(self, name: str) -> Path:
        return self.exchanges / f"{hashlib.sha256(name.encode()).hexdigest()[:40]}.json"

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                view = memoryview(json.dumps(data, separators=(",", ":")).encode())
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"the coordinator could not keep {path.name} in its state directory {self.root} "
                               f"(stateDir): {exc.strerror or exc}; a restart would not know this change") from None

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.error("state file %s cannot be read (%s): ignored", path, exc)
            return None
        try:
            data = json.loads(text)
        except ValueError as exc:
            log.error("state file %s is not valid JSON (%s): ignored", path, exc)
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            log.error("state file %s has an unknown format: ignored", path)
            return None
        return data


def _private_dir(path: Path) -> None:
    """Make ``path`` (0700) or accept it when it is a directory of ours that only we may use."""
    try:
        os.makedirs(path, 0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"stateDir: cannot create {path}: {exc}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ConfigError(f"stateDir: {path} must be a directory of this user (uid {os.getuid()}), not a link or "
                          "another user's")
    if st.st_mode & 0o077:
        raise ConfigError(f"stateDir: {path} has mode {stat.S_IMODE(st.st_mode):o}; it must be 700 (it holds "
                          f"every exchange's record): chmod 700 {path}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
