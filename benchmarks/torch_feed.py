"""Feeding a PyTorch training loop from Spark: the exchange (ExchangeDataset) against the parquet route.

The same Spark job makes the same rows (an id, 8 float features, a float label) for both routes:

* exchange: the job writes a HYBRID exchange (hash on id, 16 subpartitions) with ``format("pipelined")``
  while the training process, started and waiting beforehand, reads it (``balance="pad"``: the first epoch
  starts before the commit).
* exchange-jvm: the same exchange written by the JVM catalog's writer (``df.writeTo("exchange.<name>")``):
  no Python worker in the job.
* parquet: the job writes parquet files; the training process, started and waiting beforehand, sees the
  job's ``_SUCCESS`` file and reads the files with ``pyarrow.dataset`` in a DataLoader (each worker its
  share of the files, ``to_batches(batch_size)``).

Both loops use a DataLoader with the same workers and batch size and the same batch conversion (dict of
tensors). Measured per route, in one run:

* time to first batch: from the Spark job's start to the first batch in the loop;
* rows per second into the loop, no-op step (a re-read of the finished data: epoch 2);
* rows per second into the loop with a small model's training step (epoch 3);
* the same two with the reads in the training process itself (DataLoader num_workers=0: epochs 4-7, the no-op
  epoch three times, its best reported),
  where no worker process hands each batch's tensors over through shared memory; "best" is each
  route's faster configuration;
* peak memory: the training process's and its largest DataLoader worker's maximum RSS;
* where the exchange's first batch waits (``phases``): from the job's start to the exchange's declaration
  (Spark planning the write, the data source's planning worker), to the first producer registering (the
  first write task and its Python worker starting), to the first producer finishing, and to the first
  bytes the service counts as read.

Run: .venv/bin/python benchmarks/torch_feed.py [--rows 4000000] [--batch 1024] [--workers 2] [--quick]
         [--routes exchange,exchange-jvm]
(``--quick``: 500,000 rows, to check that it runs). Writes benchmarks/torch_feed-latest.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FEATURES = 8
EXCHANGES = {"exchange": "bench_torch_feed", "exchange-jvm": "bench_torch_feed_jvm"}  # route -> exchange
ROUTES = ("parquet", "exchange", "exchange-jvm")
# the loop's epochs: the first while the job writes, then re-reads of the finished data; the no-op epoch without
# workers (under a second for 4 M rows) three times, its best reported
STEPS = ("first", "noop", "model", "noop_inproc", "noop_inproc_2", "noop_inproc_3", "model_inproc")


# ------------------------------------------------------------------ the training process (a subprocess)
def _to_tensors(batch):
    from sparkflow_exchange.torch import to_tensors

    return to_tensors(batch)


class ParquetFeed:
    """The parquet route's IterableDataset: each DataLoader worker reads its share of the files."""

    def __init__(self, path: str, batch: int, columns: list[str]) -> None:
        self.path, self.batch, self.columns = path, batch, columns

    def __iter__(self):
        import pyarrow.dataset as pads
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        fragments = sorted(pads.dataset(self.path, format="parquet").get_fragments(), key=lambda f: f.path)
        for fragment in fragments[worker::workers]:
            for batch in fragment.to_batches(batch_size=self.batch, columns=self.columns):
                yield _to_tensors(batch)


def _loop(route: str, work: Path, batch: int, workers: int) -> None:
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    columns = [f"f{i}" for i in range(FEATURES)] + ["y"]
    if route in EXCHANGES:
        from sparkflow_exchange.torch import ExchangeDataset

        ds = ExchangeDataset(EXCHANGES[route], batch, columns=columns, balance="pad", seed=1, declareTimeout=600)
        loader = ds.loader(num_workers=workers)
    else:
        feed = type("Feed", (ParquetFeed, IterableDataset), {})(str(work / "parquet"), batch, columns)
        loader = DataLoader(feed, batch_size=None, num_workers=workers, multiprocessing_context="fork")
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    (work / f"ready-{route}").write_text("ready")
    if route == "parquet":  # the files are readable when the job has committed them
        while not (work / "parquet" / "_SUCCESS").exists():
            time.sleep(0.005)
    out: dict = {}
    for _epoch, step in enumerate(STEPS):
        if step == "noop_inproc":  # the same reads in the training process itself: no worker hands batches over
            if route in EXCHANGES:
                ds = ExchangeDataset(EXCHANGES[route], batch, columns=columns, balance="pad", seed=1)
                loader = ds.loader(num_workers=0)
            else:
                loader = DataLoader(feed, batch_size=None, num_workers=0)
        rows, first, start = 0, None, time.time()
        for b in loader:
            if first is None:
                first = time.time()
            if step.startswith("model"):
                x = torch.stack([b[f"f{i}"] for i in range(FEATURES)], dim=1)
                loss = torch.nn.functional.mse_loss(model(x), b["y"].reshape(-1, 1))
                opt.zero_grad()
                loss.backward()
                opt.step()
            rows += len(b["y"])
        out[step] = {"rows": rows, "first_batch_at": first, "start": start, "end": time.time()}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["peak_worker_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    (work / f"result-{route}.json").write_text(json.dumps(out))


# ------------------------------------------------------------------ the driver
def _features(spark, rows: int):
    return spark.range(0, rows, 1, 4).selectExpr(
        "id", *[f"CAST(sin(id * {i + 1}) AS FLOAT) AS f{i}" for i in range(FEATURES)],
        "CAST(cos(id) AS FLOAT) AS y")


def _start_loop(route: str, work: Path, args) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--loop", route, "--work", str(work),
                             "--batch", str(args.batch), "--workers", str(args.workers)])
    deadline = time.time() + 300
    while not (work / f"ready-{route}").exists():
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"the {route} training process did not start")
        time.sleep(0.05)
    return proc


class Phases(threading.Thread):
    """Seconds from ``start`` to each step of the exchange's write that its first batch may wait for, polled
    from the coordinator and the service every 50 ms."""

    def __init__(self, start: float, exchange: str) -> None:
        super().__init__(daemon=True)
        self.start_at, self.seen, self.done, self.error = start, {}, threading.Event(), ""
        self.exchange = exchange

    def _mark(self, what: str) -> None:
        self.seen.setdefault(what, round(time.time() - self.start_at, 2))

    def run(self) -> None:
        from sparkflow_exchange.config import ExchangeConfig
        from sparkflow_exchange.exchange import list_exchanges
        from sparkflow_exchange.service.discovery import coordinators

        config = None
        while not self.done.wait(0.05) and "committed" not in self.seen:
            try:
                config = config or ExchangeConfig.load()
                for d in list_exchanges(config):
                    if d["name"] != self.exchange:
                        continue
                    self._mark("declared")
                    states = [p["state"] for p in d["producers"]]
                    if states:
                        self._mark("first_producer_registered")
                    if "finished" in states:
                        self._mark("first_producer_finished")
                    if d["state"] == "committed":
                        self._mark("committed")
                for ep in coordinators(config):
                    with ep.connect(ep.coordinator, config) as conn:
                        traffic = conn.call("status").get("exchange_traffic", {}).get(self.exchange)
                    if traffic and traffic["bytes_read"] + traffic["file_bytes_read"] > 0:
                        self._mark("first_bytes_read")
            except Exception as exc:  # noqa: BLE001 - a poll between the services' start and the declaration
                self.error = f"{type(exc).__name__}: {exc}"


def _route(route: str, spark, work: Path, args) -> dict:
    import sparkflow_exchange

    df = _features(spark, args.rows)
    proc = _start_loop(route, work, args)
    try:
        start = time.time()
        phases = Phases(start, EXCHANGES.get(route, ""))
        if route == "exchange":
            phases.start()
            sparkflow_exchange.write(df, EXCHANGES[route], partitioner="hash", keys="id", numSubpartitions=16)
        elif route == "exchange-jvm":  # the JVM catalog's writer: no Python worker
            phases.start()
            df.writeTo(f"exchange.{EXCHANGES[route]}").tableProperty("keys", "id") \
                .tableProperty("numSubpartitions", "16").createOrReplace()
        else:
            df.write.mode("overwrite").parquet(str(work / "parquet"))
        written = time.time()
        if proc.wait(timeout=1800) != 0:
            raise SystemExit(f"the {route} training process failed")
    finally:
        phases.done.set()
        if proc.poll() is None:
            proc.kill()
    got = json.loads((work / f"result-{route}.json").read_text())
    first = got["first"]

    def rate(step: str) -> float:
        return got[step]["rows"] / (got[step]["end"] - got[step]["start"])

    for step in STEPS:
        if got[step]["rows"] != args.rows:
            raise SystemExit(f"{route}: epoch {step} read {got[step]['rows']} rows of {args.rows}")
    return {"write_s": written - start, "first_batch_s": first["first_batch_at"] - start,
            "first_epoch_end_s": first["end"] - start, "noop_rows_per_s": rate("noop"),
            "model_rows_per_s": rate("model"), "noop_inproc_rows_per_s": max(rate(s) for s in STEPS if s.startswith("noop_inproc")),
            "model_inproc_rows_per_s": rate("model_inproc"), "peak_rss_mb": got["peak_rss_mb"],
            "peak_worker_rss_mb": got["peak_worker_rss_mb"], "phases": phases.seen,
            "phases_last_error": phases.error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="500,000 rows: check that it runs")
    parser.add_argument("--routes", default=",".join(ROUTES), help="parquet (the baseline, always first) and the "
                        "exchange's routes: exchange (the Python writer), exchange-jvm (the JVM catalog's writer)")
    parser.add_argument("--loop", choices=ROUTES, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rows = 500_000
    if args.loop:
        _loop(args.loop, Path(args.work), args.batch, args.workers)
        return

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import sparkflow_exchange

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="torch-feed-"))
    from sparkflow_exchange.config import ExchangeConfig
    from sparkflow_exchange.service.discovery import resolve

    resolve(ExchangeConfig.load())  # the embedded service, for the JVM writer too (which starts none)
    spark = (SparkSession.builder.master("local[2]").appName("torch-feed")
             .config(map=sparkflow_exchange.SPARK_SETTINGS).config("spark.ui.enabled", "false")
             .config("spark.jars", str(sparkflow_exchange.plugin_jar()))
             .config("spark.sql.catalog.exchange", "org.sparkflow.exchange.catalog.ExchangeCatalog").getOrCreate())
    try:
        _features(spark, 100_000).write.format("noop").mode("overwrite").save()  # JVM and workers warm
        routes = ["parquet"] + [r for r in args.routes.split(",") if r != "parquet"]
        unknown = set(routes) - set(ROUTES)
        if unknown:
            raise SystemExit(f"unknown route(s) {sorted(unknown)}: choose among {', '.join(ROUTES)}")
        results = {route: _route(route, spark, work, args) for route in routes}
    finally:
        for name in EXCHANGES.values():
            try:
                sparkflow_exchange.drop_exchange(name)
            except Exception:  # noqa: BLE001 - nothing to drop when the write never started
                pass
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    pq = results["parquet"]
    for r in results.values():
        r["best_noop_rows_per_s"] = max(r["noop_rows_per_s"], r["noop_inproc_rows_per_s"])
        r["best_model_rows_per_s"] = max(r["model_rows_per_s"], r["model_inproc_rows_per_s"])
    rows = (("first_batch_s", "time to first batch (s)"), ("first_epoch_end_s", "first epoch done (s)"),
            ("noop_rows_per_s", "rows/s, no-op step"), ("model_rows_per_s", "rows/s, small model"),
            ("noop_inproc_rows_per_s", "rows/s, no-op, no workers"),
            ("model_inproc_rows_per_s", "rows/s, model, no workers"),
            ("best_noop_rows_per_s", "rows/s, no-op, best"), ("best_model_rows_per_s", "rows/s, model, best"),
            ("peak_rss_mb", "peak RSS, loop (MB)"), ("peak_worker_rss_mb", "peak RSS, a worker (MB)"))
    exchanges = [r for r in results if r != "parquet"]
    ratios = {route: {key: results[route][key] / pq[key] for key, _ in rows if pq[key]} for route in exchanges}
    report = {"rows": args.rows, "batch": args.batch, "workers": args.workers, "results": results,
              "ratios_to_parquet": ratios, "load": [load_before, os.getloadavg()[0]],
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (HERE / "torch_feed-latest.json").write_text(json.dumps(report, indent=2))
    print(f"{'':28}" + "".join(f"{r:>14}" for r in results) + "".join(f"{r + '/pq':>18}" for r in exchanges))
    for key, label in rows:
        print(f"{label:28}" + "".join(f"{results[r][key]:14.2f}" for r in results)
              + "".join(f"{ratios[r].get(key, float('nan')):18.2f}" for r in exchanges))
    for route in exchanges:
        ex = results[route]
        print(f"{route}'s first batch, from the job's start (s): "
              + ", ".join(f"{k} {v}" for k, v in sorted(ex["phases"].items(), key=lambda kv: kv[1]))
              + f", first batch {ex['first_batch_s']:.2f}")
    print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")

if __name__ == "__main__":
    main()
