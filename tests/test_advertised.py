"""The address a service advertises: one other hosts can reach, never loopback when bound to every interface."""
from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import start_service

from sparkflow_exchange.network.address import parse_address
from sparkflow_exchange.network.advertised import AddressSource, AdvertiseError, advertised_host, interface_addresses


def _none(family: int) -> list[str]:
    return []


def _loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def _host_address() -> str:
    found = interface_addresses(socket.AF_INET)
    if not found:
        pytest.skip("this host has no non-loopback IPv4 address")
    return found[0]


def test_a_specific_bind_address_is_advertised_as_is():
    got = advertised_host("127.0.0.1", env={}, interfaces=_none)
    assert (got.host, got.source) == ("127.0.0.1", AddressSource.BOUND)


def test_the_setting_wins_over_everything():
    got = advertised_host("0.0.0.0", setting="198.18.0.9", env={"SPARK_LOCAL_IP": "198.18.0.5"})
    assert (got.host, got.source) == ("198.18.0.9", AddressSource.SETTING)
    assert got.with_port(7337) == "198.18.0.9:7337"


def test_spark_local_ip_comes_before_the_routes():
    got = advertised_host("0.0.0.0", env={"SPARK_LOCAL_IP": "198.18.0.5"}, coordinator="198.18.0.1:7000",
                          driver_host="198.18.0.6")
    assert (got.host, got.source) == ("198.18.0.5", AddressSource.SPARK_LOCAL_IP)


def test_driver_host_is_used_when_spark_local_ip_is_not():
    got = advertised_host("0.0.0.0", env={}, driver_host="198.18.0.6")
    assert (got.host, got.source) == ("198.18.0.6", AddressSource.DRIVER_HOST)


def test_loopback_from_spark_is_skipped_for_a_wildcard_bind():
    got = advertised_host("0.0.0.0", env={"SPARK_LOCAL_IP": "127.0.0.1"}, driver_host="localhost",
                          interfaces=lambda family: ["198.18.0.7"])
    assert (got.host, got.source) == ("198.18.0.7", AddressSource.INTERFACE)


def test_the_interface_that_routes_to_the_coordinator():
    mine = _host_address()
    got = advertised_host("0.0.0.0", env={}, coordinator=f"{mine}:7000", interfaces=_none)
    assert (got.host, got.source) == (mine, AddressSource.ROUTE)


def test_a_coordinator_on_loopback_or_a_unix_socket_gives_no_route():
    for coordinator in ("127.0.0.1:7000", "unix:/tmp/x.sock"):
        got = advertised_host("0.0.0.0", env={}, coordinator=coordinator, interfaces=lambda family: ["198.18.0.7"])
        assert got.source is AddressSource.INTERFACE


def test_interface_addresses_are_this_hosts_and_never_loopback():
    for family, _wildcard in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        for address in interface_addresses(family):
            assert not _loopback(address)
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((address, 0))  # fails unless the address is one of this host's


def test_no_address_at_all_is_a_clear_error():
    with pytest.raises(AdvertiseError, match="cannot tell which address.*set advertisedHost"):
        advertised_host("0.0.0.0", env={"SPARK_LOCAL_IP": "127.0.0.1"}, coordinator="127.0.0.1:1",
                        interfaces=_none)


def test_a_loopback_or_unresolvable_setting_is_refused():
    with pytest.raises(AdvertiseError, match="loopback"):
        advertised_host("0.0.0.0", setting="127.0.0.1")
    with pytest.raises(AdvertiseError, match="does not resolve"):
        advertised_host("0.0.0.0", setting="no-such-host.invalid")


def test_a_service_bound_to_every_interface_advertises_a_reachable_address(tmp_path):
    _host_address()
    svc = start_service(tmp_path / "svc", host="0.0.0.0")
    try:
        address = parse_address(svc.tcp)
        assert not _loopback(address.host)
        assert address.host in interface_addresses(socket.AF_INET)
        with svc.connect() as conn:  # reachable at the address it advertises
            assert conn.call("ping")["tcp"] == svc.tcp
    finally:
        svc.stop()


def test_a_service_advertises_its_setting(tmp_path):
    mine = _host_address()
    svc = start_service(tmp_path / "svc", host="0.0.0.0", conf={"advertisedHost": mine})
    try:
        assert parse_address(svc.tcp).host == mine
    finally:
        svc.stop()


def test_a_service_that_cannot_tell_refuses_to_start_saying_why(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "sparkflow_exchange.service", "--host", "0.0.0.0", "--port", "0",
                           "--advertised-host", "no-such-host.invalid", "--spill-dir", str(tmp_path / "spill"),
                           "--insecure", "--insecure-beyond-loopback", "--state-file", str(tmp_path / "state.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "advertisedHost 'no-such-host.invalid' does not resolve" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_drivers_spark_driver_host_comes_from_its_command_line_else_spark_defaults(tmp_path, monkeypatch):
    from sparkflow_exchange.service.plugin import spark_driver_host

    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    given = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--conf",
                              "spark.driver.host=198.18.0.4"])
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for proc in (given, plain):  # until each child runs its own command line (under load it may not yet)
            deadline = time.monotonic() + 30
            while b"time.sleep(120)" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                assert time.monotonic() < deadline, f"process {proc.pid} did not start its command in 30 s"
                time.sleep(0.01)
        assert spark_driver_host(given.pid) == "198.18.0.4"
        assert spark_driver_host(plain.pid) is None
        (conf / "spark-defaults.conf").write_text("spark.driver.host  198.18.0.5\n")
        assert spark_driver_host(plain.pid) == "198.18.0.5"
    finally:
        for proc in (given, plain):
            proc.kill()
            proc.wait(10)
