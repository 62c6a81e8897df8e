"""Prometheus text metrics on an optional HTTP port (``metricsPort``), from the same status as the CLI."""
from __future__ import annotations

import asyncio
from typing import Callable

from ..network.listener import Listener, tcp_sockets

REPORTED_PATH = "local_file"  # the status's traffic entry that readers report, not the service's own count


def escape_label(value: object) -> str:
    """A label value as the exposition format wants it: backslash, double quote and line feed escaped, so
    a newline in an exchange name cannot start a line (a sample) of its own."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
    return "{" + inner + "}" if inner else ""


def render(status: dict) -> str:
    """The service status as Prometheus exposition text."""
    svc = status["service"]
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        out.append(f"# HELP sparkflow_{name} {help_text}")
        out.append(f"# TYPE sparkflow_{name} {kind}")
        for labels, value in samples:
            out.append(f"sparkflow_{name}{_labels(service=svc['service_id'], **labels)} {value}")

    metric("memory_budget_bytes", "gauge", "memory.budget of the service", [({}, status["memory"]["budget"])])
    metric("memory_reserved_bytes", "gauge", "bytes held by buffers or promised as credit",
           [({}, status["memory"]["reserved"])])
    metric("memory_used_bytes", "gauge", "bytes held by buffers in partition pools", [({}, status["memory"]["used"])])
    metric("memory_peak_used_bytes", "gauge", "the most bytes held by buffers at once, since the service started",
           [({}, status["memory"]["peak_used"])])
    metric("memory_peak_reserved_bytes", "gauge", "the most bytes held by buffers or promised as credit at once, "
           "since the service started", [({}, status["memory"]["peak_reserved"])])
    metric("open_spill_files", "gauge", "read fds of finished spill files kept open (LRU)",
           [({}, status["memory"]["open_spill_reads"])])
    parts = status["partitions"]
    metric("partition_bytes_total", "counter", "bytes pushed into a result partition",
           [({"partition": p["partition"], "exchange": p["exchange"]}, p["bytes"]) for p in parts])
    metric("partition_raw_bytes_total", "counter", "bytes pushed into a result partition as they would be "
           "uncompressed (equal to partition_bytes_total where nothing is compressed)",
           [({"partition": p["partition"], "exchange": p["exchange"]}, p.get("raw_bytes", p["bytes"])) for p in parts])
    metric("partition_buffers_total", "counter", "buffers pushed into a result partition",
           [({"partition": p["partition"], "exchange": p["exchange"]}, p["buffers"]) for p in parts])
    metric("partition_pool_used", "gauge", "in-memory buffers of a partition's pool in use",
           [({"partition": p["partition"]}, p["pool_used"]) for p in parts])
    metric("partition_pool_target", "gauge", "buffers a partition's pool may hold now (its share of the budget)",
           [({"partition": p["partition"]}, p["pool_slots"]) for p in parts])
    metric("partition_spill_bytes", "gauge", "bytes in a partition's spill file",
           [({"partition": p["partition"]}, p["spill_bytes"]) for p in parts])
    metric("partition_backpressure_ratio", "gauge",
           "share of time the writer waited for credit (backPressuredTimeMsPerSecond / 1000)",
           [({"partition": p["partition"]}, p.get("backpressure_ratio", 0.0)) for p in parts])
    chans = status["channels"]
    labels = [{"partition": c["partition"], "subpartition": c["subpartition"], "locality": c["locality"]} for c in chans]
    metric("channel_credit", "gauge", "credit a consumer channel has announced and not used",
           [(lab, c["credit"]) for lab, c in zip(labels, chans)])
    metric("channel_backlog", "gauge", "data buffers queued for a consumer channel",
           [(lab, c["backlog"]) for lab, c in zip(labels, chans)])
    metric("channel_bytes_sent_total", "counter", "bytes sent to a consumer channel",
           [(lab, c["bytes_sent"]) for lab, c in zip(labels, chans)])
    metric("connections", "gauge", "open client connections", [({}, len(status["connections"]))])
    metric("connections_refused_total", "counter", "connections refused for want of room (a cap full, no fds)",
           [({}, status.get("refused_connections", 0))])
    metric("exchanges", "gauge", "exchanges known to the coordinator", [({}, len(status["exchanges"]))])
    replicated = [(e["name"], e["replication"]) for e in status["exchanges"] if e.get("replication")]
    for state, help_text in (("replicated", "with every replica the exchange's replicas option asks for complete"),
                             ("under_replicated", "with fewer complete replicas than asked (a replica's service was "
                                                  "lost): read from their own service, with no copy left"),
                             ("failed_over", "read from a replica since their own service was lost")):
        metric(f"exchange_partitions_{state}", "gauge", f"committed partitions of a replicated exchange {help_text}",
               [({"exchange": name}, r[state]) for name, r in replicated])
    if "disk" in status:
        metric("disk_used_bytes", "gauge", "bytes of spill files the service holds", [({}, status["disk"]["used"])])
        metric("disk_limit_bytes", "gauge", "maxDiskBytes: most bytes of spill files the service holds",
               [({}, status["disk"]["limit"])])
        if "root_bytes" in status["disk"]:
            metric("disk_leftover_bytes", "gauge", "bytes dead services left under the spill root that the "
                   "service could not remove (counted in disk_used_bytes)", [({}, status["disk"]["leftover"])])
            metric("disk_root_bytes", "gauge", "bytes of every service's spill directory under the spill root "
                   "(live neighbours', dead ones' leftovers), as found on disk", [({}, status["disk"]["root_bytes"])])
    # counters of what the service itself observed; what clients report is counted apart, named "reported"
    # (any credential may report anything: it must never inflate what the service measured)
    traffic = status.get("traffic", {})
    metric("read_bytes_total", "counter", "payload bytes the service served to readers, by path (local, "
           "local_shared: to a reader on its host; remote: to one on another host)",
           [({"path": path}, value) for path, value in sorted(traffic.items()) if path != REPORTED_PATH])
    metric("reported_file_read_bytes_total", "counter", "bytes readers on the service's host read from its spill "
           "files themselves, as reported by readers (not observed by the service; any credential may report)",
           [({}, traffic.get(REPORTED_PATH, 0))])
    held = status.get("exchange_traffic", {})
    metric("exchange_written_bytes", "gauge", "bytes written into the partitions of an exchange this service holds",
           [({"exchange": name}, t["bytes_written"]) for name, t in sorted(held.items())])
    metric("exchange_read_bytes", "gauge", "bytes the service served from the partitions of an exchange it "
           "holds, over channels (restarts from 0 when the exchange is overwritten)",
           [({"exchange": name, "path": "channel"}, t["bytes_read"]) for name, t in sorted(held.items())])
    metric("exchange_reported_file_read_bytes", "gauge", "bytes readers on the service's host read from the spill "
           "files of an exchange it holds, as reported by readers (not observed by the service; restarts from 0 "
           "when the exchange is overwritten)",
           [({"exchange": name}, t["file_bytes_read"]) for name, t in sorted(held.items())])
    metric("exchange_read_buffers", "gauge", "buffers read over channels from the partitions of an exchange this "
           "service holds (restarts from 0 when the exchange is overwritten)",
           [({"exchange": name}, t.get("buffers_read", 0)) for name, t in sorted(held.items())])
    return "\n".join(out) + "\n"


class MetricsServer:
    def __init__(self, listeners: list[Listener]) -> None:
        self.listeners = listeners
        self.port = listeners[0].getsockname()[1]

    def close(self) -> None:
        for listener in self.listeners:
            listener.close()


MAKES_ROOM_AFTER = 1.0  # s: a connection open this long (a scrape takes milliseconds) gives way to a newcomer
MAX_REQUEST = 16 << 10  # bytes of request line and headers


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """The request line, after reading the headers up to the blank line (at most MAX_REQUEST bytes)."""
    request = await reader.readline()
    size = len(request)
    while True:
        line = await reader.readline()
        size += len(line)
        if size > MAX_REQUEST:
            raise ValueError("request headers too long")
        if line in (b"\r\n", b"\n", b""):
            return request


async def start_metrics_server(status: Callable[[], dict], host: str, port: int, *, timeout: float = 5.0,
                               max_connections: int = 16) -> MetricsServer:
    """Serve ``status()`` (the service's status) as Prometheus text.

    The port carries no authentication, so what a client can hold there is bounded: the whole request must
    arrive within ``timeout`` (a client trickling header lines is cut off all the same) and the answer be
    taken within as long again; at most ``max_connections`` are served at once, a newcomer taking the place of
    the oldest one open for MAKES_ROOM_AFTER, else closed at once (so the service's descriptors stay its own)."""
    loop = asyncio.get_running_loop()
    open_now: dict[asyncio.StreamWriter, float] = {}  # oldest first -> when it connected

    def admitted(writer: asyncio.StreamWriter) -> bool:
        if len(open_now) >= max_connections:
            oldest, since = next(iter(open_now.items()))
            if loop.time() - since < MAKES_ROOM_AFTER:
                return False
            del open_now[oldest]
            oldest.transport.abort()
        open_now[writer] = loop.time()
        return True

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not admitted(writer):
            writer.transport.abort()
            return
        try:
            request = await asyncio.wait_for(_read_request(reader), timeout)
            if request.split()[:2] == [b"GET", b"/metrics"]:
                body, code = render(status()).encode(), "200 OK"
            else:
                body, code = b"only GET /metrics is served\n", "404 Not Found"
            writer.write(f"HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await asyncio.wait_for(writer.drain(), timeout)
        except (asyncio.TimeoutError, OSError, IndexError, ValueError):  # ValueError: a line or headers too long
            writer.transport.abort()
        finally:
            open_now.pop(writer, None)
            writer.close()

    def protocol() -> asyncio.StreamReaderProtocol:
        return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=MAX_REQUEST), handle)

    # accepted as the service's own port is: out of fds, a scrape is refused, the loop does not spin
    return MetricsServer([Listener(sock, protocol, plain=True) for sock in await tcp_sockets(host, port)])
