"""The service's Prometheus text against what depends on it: series stay bounded when one exchange is
written again and again, and every metric the Grafana dashboard queries exists in a real scrape."""
from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from harness import client_config

from sparkflow_exchange import exchange as ex
from sparkflow_exchange import write_handle as wh

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "sparkflow-exchange.json"
PROMQL_WORDS = {"sum", "by", "rate", "max", "on", "group_left", "label_values", "service", "exchange", "path",
                "partition", "locality", "m"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write(config, rows: int) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    handle = ex.declare_write(config, schema, overwrite=True)
    producers = [ex.ProducerTask(handle, i, f"a{i}") for i in range(2)]
    for p in producers:
        p.write([pa.record_batch([pa.array(range(rows), pa.int64())], schema=schema)])
    wh.commit_write(handle, [p.finish()["partition"] for p in producers])


def _read_all(config) -> int:
    desc = ex.describe_exchange(config)
    return sum(b.num_rows for i in range(desc.num_subpartitions) for b in ex.read_subpartition(config, desc, i))


def _series(body: str) -> set[str]:
    """Every sample's name and labels (one series each)."""
    return {line.rsplit(" ", 1)[0] for line in body.splitlines() if line and not line.startswith("#")}


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()


def test_series_stay_flat_across_20_writes_of_one_exchange(tmp_service):
    port = _free_port()
    svc = tmp_service(conf={"metricsPort": port})
    config = client_config(svc, exchange="again", partitioner="hash", keys="id", numSubpartitions=2)
    counts = []
    for _ in range(20):
        _write(config, 1000)
        assert _read_all(config) == 2000
        counts.append(len(_series(_scrape(port))))
    # the first write brings the exchange's series; every later one replaces them (its partitions released)
    assert counts == [counts[0]] * 20, counts
    body = _scrape(port)
    assert len(re.findall(r'^sparkflow_partition_bytes_total\{.*exchange="again"', body, re.M)) == 2, body


def test_every_metric_the_dashboard_queries_exists_in_a_real_scrape(tmp_service):
    port = _free_port()
    svc = tmp_service(conf={"metricsPort": port})
    config = client_config(svc, exchange="dashboard", partitioner="hash", keys="id", numSubpartitions=2,
                           hostId="another-host")  # a remote channel: channel series exist
    _write(config, 5000)
    desc = ex.describe_exchange(config)
    it = ex.read_subpartition(config, desc, 0)
    next(it)  # a channel open while scraped
    body = _scrape(port)
    exported = set(re.findall(r"^# TYPE (\w+) ", body, re.M))  # a metric with no sample now is still there
    assert any(line.startswith("sparkflow_exchange_written_bytes{") for line in body.splitlines()), body
    sum(b.num_rows for b in it)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    queried = {w for e in exprs for w in re.findall(r"\b[a-z_][a-z0-9_]*\b", re.sub(r'"[^"]*"|\[[^]]*\]', "", e))
               if w not in PROMQL_WORDS}
    assert queried, exprs
    assert all(name.startswith("sparkflow_") for name in queried), queried
    assert queried <= exported, f"the dashboard queries metrics no service exports: {sorted(queried - exported)}"
    assert len(dashboard["panels"]) >= 6


def _read_bytes(port: int, exchange: str, path: str) -> int:
    """Bytes read from ``exchange``: served over a ``channel``, or a ``local_file`` read its readers report."""
    if path == "channel":
        prefix, labels = "sparkflow_exchange_read_bytes{service=\"", f'exchange="{exchange}",path="channel"}}'
    else:
        prefix, labels = "sparkflow_exchange_reported_file_read_bytes{service=\"", f'exchange="{exchange}"}}'
    lines = [line for line in _scrape(port).splitlines() if line.startswith(prefix) and labels in line]
    return int(float(lines[0].split()[-1])) if lines else 0


@pytest.mark.parametrize("host, path", [("hostA", "local_file"), ("hostB", "channel")],
                         ids=["spill file on this host", "channel"])
def test_read_bytes_grow_during_a_read_of_a_finished_exchange(tmp_service, host, path):
    """Scraped between the batches of one read that lasts some seconds (a pause after each batch; readers
    on the service's host report their spill-file reads about once a second while they read: a series of
    its own, ``sparkflow_exchange_reported_file_read_bytes``)."""
    port = _free_port()
    svc = tmp_service(conf={"metricsPort": port}, host_id="hostA")
    config = client_config(svc, exchange="reread", partitioner="hash", keys="id", numSubpartitions=1,
                           partitionType="HYBRID", bufferSize="16k", hostId=host)
    _write(config, 200_000)  # committed before the read starts: 3.2 MB in some 200 buffers
    desc = ex.describe_exchange(config)
    rows, seen = 0, []
    for i, batch in enumerate(ex.read_subpartition(config, desc, 0)):
        rows += batch.num_rows
        time.sleep(0.05)
        if i % 10 == 9:
            seen.append(_read_bytes(port, "reread", path))
    assert rows == 400_000
    during = sorted(set(v for v in seen if v > 0))
    assert len(during) >= 2 and seen == sorted(seen), seen  # grew, step by step, before the read ended


def _samples(body: str, name: str) -> dict[str, float]:
    """labels -> value of every sample of metric ``name``."""
    out = {}
    for line in body.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_a_client_cannot_inflate_the_services_read_counters(tmp_service):
    """What readers report (their reads of spill files on the service's host, which the service cannot see)
    is counted apart, under names that say so: the read counters hold only bytes the service served."""
    port = _free_port()
    svc = tmp_service(conf={"metricsPort": port})
    config = client_config(svc, exchange="counted", partitioner="hash", keys="id", numSubpartitions=1,
                           hostId="another-host")  # a remote reader: every byte it reads, the service serves
    _write(config, 5000)
    assert _read_all(config) == 10_000
    before = _scrape(port)
    served = sum(_samples(before, "sparkflow_read_bytes_total").values())
    channel = _samples(before, "sparkflow_exchange_read_bytes")
    assert served > 0 and sum(channel.values()) > 0
    [(part, size)] = [(p["partition"], p["bytes"]) for p in svc.status()["partitions"]][:1]
    huge = 10 ** 15
    with svc.connect() as conn:  # any credential may report; here the service's own secret
        conn.call("report_file_reads", bytes=huge, partitions={part: huge, "no-such-partition": huge})
    after = _scrape(port)
    assert sum(_samples(after, "sparkflow_read_bytes_total").values()) == served
    assert _samples(after, "sparkflow_exchange_read_bytes") == channel
    # counted apart, only for a partition the service holds, and at most its size per report
    assert size > 0
    assert list(_samples(after, "sparkflow_reported_file_read_bytes_total").values()) == [size]
    reported = _samples(after, "sparkflow_exchange_reported_file_read_bytes")
    assert [v for k, v in reported.items() if 'exchange="counted"' in k] == [size]
    assert "reported by readers" in after
