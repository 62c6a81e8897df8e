"""Service addresses: ``host:port`` (TCP) or ``unix:/path`` (Unix domain socket)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Address:
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def is_unix(self) -> bool:
        return bool(self.path)

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.path else f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    text = text.strip()
    if text.startswith("unix:"):
        path = text[5:]
        while path.startswith("//"):
            path = path[1:]
        if not path:
            raise ValueError(f"empty Unix socket path in address {text!r}")
        return Address(path=path)
    if text.startswith("tcp://"):
        text = text[6:]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not a service address: {text!r} (use host:port or unix:/path)")
    return Address(host=host.strip("[]") or "127.0.0.1", port=int(port))
