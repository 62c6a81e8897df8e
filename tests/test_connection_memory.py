"""A closed server connection is freed by reference counting alone.

The service raises the young-generation threshold of the cyclic collector (``service/main.py``), so
garbage that only a cyclic collection frees stays for a long time; a closed connection holds its
decoder's staging area, and kept alive through a cycle, thousands of them grew a service by ~1 GB
within minutes of connections opening and closing. The first test needs no socket; the second serves
one end of a socket pair, as the service serves a plain connection (through its socket writer).
"""
from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from types import SimpleNamespace

from sparkflow_exchange.network.server import ServerConnection
from sparkflow_exchange.network.socket_writer import SocketWriter


def _host() -> SimpleNamespace:
    return SimpleNamespace(credentials={}, service_id="svc", host_id="host", traffic={"local": 0, "remote": 0},
                           producer_lost=lambda part, reason: None, discharge=lambda conn: None,
                           on_connection_closed=lambda conn: None, admit=lambda conn: None,
                           config=SimpleNamespace(hello_timeout=30.0))


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


def test_a_closed_connection_with_its_socket_writer_goes_without_a_cyclic_collection():
    """Served over a socket, a connection writes through a SocketWriter that holds its flow-control and failure
    callbacks (its bound methods): closed, it is still freed by reference counting alone."""
    was_enabled = gc.isenabled()
    gc.disable()
    ours, theirs = socket.socketpair()
    loop = asyncio.new_event_loop()
    try:
        async def serve_and_close() -> weakref.ref:
            _, conn = await asyncio.get_running_loop().connect_accepted_socket(
                lambda: ServerConnection(_host(), "unix"), ours)
            assert isinstance(conn.writer, SocketWriter)  # the path under test: a plain socket's own writer
            assert theirs.recv(4096)  # the greeting went out through it
            ref = weakref.ref(conn)
            conn.close()
            del conn
            for _ in range(10):  # the transport's close reaches connection_lost on a later turn of the loop
                await asyncio.sleep(0)
            return ref

        ref = loop.run_until_complete(serve_and_close())
        assert ref() is None, "a closed connection is still referenced (a cycle only gc would free)"
    finally:
        loop.close()
        theirs.close()
        if was_enabled:
            gc.enable()
