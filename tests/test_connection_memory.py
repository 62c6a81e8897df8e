"""A closed server connection is freed by reference counting alone.

The service raises the young-generation threshold of the cyclic collector (``service/main.py``), so
garbage that only a cyclic collection frees stays for a long time; a closed connection holds its
decoder's staging area, and kept alive through a cycle, thousands of them grew a service by ~1 GB
within minutes of connections opening and closing. Nothing here needs a socket.
"""
from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

from sparkflow_exchange.network.server import ServerConnection


def _host() -> SimpleNamespace:
    return SimpleNamespace(credentials={}, service_id="svc", host_id="host", traffic={"local": 0, "remote": 0},
                           producer_lost=lambda part, reason: None, discharge=lambda conn: None,
                           on_connection_closed=lambda conn: None)


def test_a_closed_connection_goes_without_a_cyclic_collection():
    conn = ServerConnection(_host(), "unix")
    ref = weakref.ref(conn)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        conn.connection_lost(None)
        del conn
        assert ref() is None, "a closed connection is still referenced (a cycle only gc would free)"
    finally:
        if was_enabled:
            gc.enable()
