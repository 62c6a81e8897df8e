"""The address a service tells others to reach it at (its ``tcp`` address in every answer and record).

A service bound to one address advertises that address. One bound to every interface (``0.0.0.0``,
``::``) must name an address other hosts can use, never loopback and never a name only this host can
resolve. In order: the ``advertisedHost`` setting; Spark's own notion of this host's address
(``SPARK_LOCAL_IP``, ``spark.driver.host`` on the driver); the address of the interface that routes to
the coordinator; the address of the interface of the default route, else of any non-loopback
interface. When none is found the service refuses to start, saying so.
"""
from __future__ import annotations

import enum
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError
from .address import parse_address

WILDCARDS = ("", "0.0.0.0", "::")
SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address
# a documentation address (RFC 5737 / RFC 3849): a UDP connect to it picks the default route's interface
# and sends nothing
_DEFAULT_ROUTE_PROBE = {socket.AF_INET: "192.0.2.1", socket.AF_INET6: "2001:db8::1"}


class AddressSource(enum.Enum):
    """Where the advertised address came from (shown in the service's log and status)."""
    SETTING = "advertisedHost"
    BOUND = "bindHost"
    SPARK_LOCAL_IP = "SPARK_LOCAL_IP"
    DRIVER_HOST = "spark.driver.host"
    ROUTE = "route to the coordinator"
    INTERFACE = "interface address"


@dataclass(frozen=True)
class Advertised:
    host: str
    source: AddressSource

    def with_port(self, port: int) -> str:
        """``host:port`` (an IPv6 address in brackets)."""
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"


class AdvertiseError(ConfigError):
    """No address other hosts can reach this service at could be told (or the one given is unusable)."""


def advertised_host(bound: str, *, family: int = socket.AF_INET, setting: str | None = None,
                    coordinator: str | None = None, driver_host: str | None = None,
                    env: Mapping[str, str] | None = None,
                    interfaces: Callable[[int], list[str]] | None = None) -> Advertised:
    """The address to advertise for a service listening on ``bound`` (an address of ``family``).

    ``driver_host``: ``spark.driver.host`` when the service runs with the driver; ``env``: the
    environment (default ``os.environ``); ``interfaces``: this host's usable addresses of a family, best
    first (default :func:`interface_addresses`).
    """
    env = os.environ if env is None else env
    wildcard = bound in WILDCARDS
    if setting:
        if wildcard and _resolves_to_loopback(setting):
            raise AdvertiseError(f"advertisedHost {setting!r} is a loopback address: other hosts cannot reach a "
                                 f"service bound to every interface ({bound or '0.0.0.0'}) there")
        if not _resolves(setting):
            raise AdvertiseError(f"advertisedHost {setting!r} does not resolve on this host; "
                                 "give an address or a name every host resolves")
        return Advertised(setting, AddressSource.SETTING)
    if not wildcard:
        return Advertised(bound, AddressSource.BOUND)
    for value, source in ((env.get("SPARK_LOCAL_IP", ""), AddressSource.SPARK_LOCAL_IP),
                          (driver_host or "", AddressSource.DRIVER_HOST)):
        value = value.strip()
        if value and _resolves(value, family) and not _resolves_to_loopback(value):
            return Advertised(value, source)
    routed = _route_to(coordinator, family)
    if routed:
        return Advertised(routed, AddressSource.ROUTE)
    found = (interfaces or interface_addresses)(family)
    if found:
        return Advertised(found[0], AddressSource.INTERFACE)
    raise AdvertiseError(
        f"cannot tell which address other hosts reach this service at: it listens on every interface "
        f"({bound or '0.0.0.0'}) and there is no advertisedHost setting, no usable SPARK_LOCAL_IP, no route to "
        f"a coordinator and no non-loopback {_family_name(family)} interface address; set advertisedHost")


def interface_addresses(family: int = socket.AF_INET) -> list[str]:
    """This host's non-loopback, non-link-local addresses of ``family``: the default route's first."""
    if family == socket.AF_INET6:
        found = _ipv6_addresses()
    else:
        found = _ipv4_addresses(name for _, name in socket.if_nameindex())
    default = _route_from(_DEFAULT_ROUTE_PROBE.get(family, "192.0.2.1"), family)
    if default in found:
        found.remove(default)
        found.insert(0, default)
    return found


def _usable(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def _ipv4_addresses(names: Iterable[str]) -> list[str]:
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                raw = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = socket.inet_ntoa(raw[20:24])
            if _usable(address) and address not in out:
                out.append(address)
    return out


def _ipv6_addresses() -> list[str]:
    out = []
    try:
        lines = open("/proc/net/if_inet6").read().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) < 6:
            continue
        address = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
        if _usable(address) and address not in out:
            out.append(address)
    return out


def _route_to(coordinator: str | None, family: int) -> str | None:
    """The address of the interface that routes to the coordinator (none for a Unix socket or loopback)."""
    if not coordinator:
        return None
    try:
        target = parse_address(coordinator)
    except ValueError:
        return None
    if target.is_unix:
        return None
    return _route_from(target.host, family, target.port)


def _route_from(host: str, family: int, port: int = 9) -> str | None:
    """The local address a datagram to ``host`` would leave from (a UDP connect sends no packet)."""
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for fam, kind, proto, _name, address in infos:
        try:
            with socket.socket(fam, kind, proto) as sock:
                sock.connect(address)
                local = sock.getsockname()[0]
        except OSError:  # no route
            continue
        if _usable(local):
            return local
    return None


def _resolves(host: str, family: int = socket.AF_UNSPEC) -> bool:
    try:
        return bool(socket.getaddrinfo(host, None, family, socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


def _resolves_to_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return any(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def _family_name(family: int) -> str:
    return "IPv6" if family == socket.AF_INET6 else "IPv4"
