"""TPC-H queries split into two applications joined by an exchange, against parquet between them and one application.

Each query is cut at its biggest shuffle. A **producer** application scans the TPC-H parquet files, filters
and joins up to that shuffle and writes the rows hashed on ONE column, the key of the consumer's next join
or groupBy (``partitioner=hash``, ``keys=K``, ``numSubpartitions=N``, N = ``spark.sql.shuffle.partitions``);
a **consumer** application reads them and finishes the query. The halves are SQL written once
(``QUERIES``), shared by every route; the consumer's input is the temporary view ``exchanged``.

| query | producer | exchange hashed on | consumer's next step on it |
|---|---|---|---|
| Q3 | lineitem shipped after 1995-03-15 | ``l_orderkey`` | join with orders of BUILDING customers, groupBy ``l_orderkey`` |
| Q5 | lineitem ⋈ orders of 1994 | ``o_custkey`` | join with customer, then supplier, nation, region (ASIA) |
| Q9 | lineitem ⋈ part (green) ⋈ partsupp ⋈ supplier ⋈ nation | ``l_orderkey`` | join with orders, groupBy nation, year |
| Q10 | returned lineitem ⋈ orders of 1993 Q4 | ``o_custkey`` | join with customer and nation, groupBy customer |
| Q18 | lineitem (order key, quantity) | ``l_orderkey`` | groupBy ``l_orderkey`` having sum > 300, joins on ``l_orderkey`` |

Routes; every application is a fresh Python process with a fresh SparkSession (``local[2]``,
``sparkflow_exchange.SPARK_SETTINGS``, Spark's defaults otherwise: adaptive execution on), timed by its
wall clock from process start to exit, so interpreter, JVM and session start count:

* ``pipelined``: the producer writes ``format("pipelined")``, then the consumer reads it with
  ``spark.read.format("pipelined")`` (Spark re-shuffles for the consumer's join or groupBy on the key:
  a Python data source cannot report its partitioning).
* ``pipelined-jvm``: the same producer; the consumer reads through the JVM catalog,
  ``spark.table("exchange.<name>")``, which reports ``bucket(N, K)`` partitioning, so a groupBy or a join on
  K does not shuffle the exchange's side (the consumer sets
  ``spark.sql.sources.v2.bucketing.shuffle.enabled=true``: the other side of such a join is shuffled into
  the exchange's layout, as a bucketed table's would be).
* ``jvm``: the producer writes through the JVM catalog (``df.writeTo("exchange.<name>")``, hashed on K into
  N, no Python worker) and the consumer reads through it as ``pipelined-jvm`` does: no Python worker in
  either application.
* ``jvm-none``: the ``jvm`` route with ``compression=none`` on its write (a table property): with ``jvm`` in the same
  run, what the default compression costs or saves each pair, measured with the routes interleaved.
* ``format``: both applications load the plugin jar and use ``df.write.format("pipelined")`` and
  ``spark.read.format("pipelined")`` with the options of the ``pipelined`` route; the jar serves both in the JVM
  (the write starts the embedded service from the JVM, the read reads partition i from subpartition i and
  reports the partitioning), so no Python worker runs.
* ``jvm-concurrent``: the ``jvm`` route's two applications started together; the consumer's catalog waits for
  the exchange's commit (``spark.sql.catalog.exchange.commitTimeout``) and then reads it, so its session start
  and planning overlap the producer's run. Seconds until both exited.
* ``format-concurrent``: the ``format`` route's two applications started together; the consumer's read waits for
  the exchange to be declared (``declareTimeout``) and the jar reads it in the JVM while it is written. Seconds
  until both exited.
* ``pipelined-concurrent``: producer and consumer started together; the consumer's Python read waits for
  the exchange to be declared (``declareTimeout``) and reads it while it is written. Seconds until both exited.
* ``parquet``: the producer writes the same rows as parquet to a temporary directory (as they are, no
  repartition), the consumer reads them and runs the same consumer half.
* ``one-app``: the whole query in one application (producer half, then consumer half, no write).
* ``noop-producer``: the producer application alone, writing into Spark's ``noop`` sink: what any producer of
  the split pays before its write. With the ``jvm`` route's consumer it gives the ratio a free write would reach
  (``jvm-free-write/parquet``); it has no answer to check.

The exchange routes' producer starts this run's embedded exchange service (its runtime directory is the
run's own); after each route's consumer the exchange is dropped and the service stopped by its pid, so every
route starts from the same state: the first application of a pipeline pays the service's start, as a
user's first application does.

N is ``spark.sql.shuffle.partitions`` of every application, Spark's default 200 unless
``--shuffle-partitions`` says otherwise: the width an untuned application shuffles to, and the one the
JVM catalog needs given explicitly to report the partitioning. Adaptive execution coalesces Spark's own
shuffles (parquet, one-app) into fewer tasks; the JVM catalog groups the N subpartitions into as few read
partitions by the same rule (``readPartitions=auto``, still key-grouped), the Python reader reads N.

Every route's answer is checked against DuckDB running the original TPC-H query on the same parquet files
(rows sorted, decimals and doubles within 1e-6 relative); a wrong answer stops the run. The consumers'
plans are kept: the shuffles each one ran (``Exchange`` nodes of the final plan) are counted in the table
and listed in the JSON. The catalog reports the exchange's size too, so Spark may broadcast a small
exchange instead of joining on its key; ``--conf spark.sql.autoBroadcastJoinThreshold=-1`` shows the joins
planned on the key. Before each route the previous one's dirty pages are synced (``os.sync``).

Data: ``tpchgen-cli`` (``.venv/bin/python -m pip install tpchgen-cli``) writes the eight tables as parquet
into ``benchmarks/.tpch/sf<N>`` once (ignored by git); later runs reuse them.

Each figure is the median of ``--repeat`` rounds (3 by default; routes interleaved within a round, in reverse
order every other round, so a slow spell or a drift of the machine falls on every route alike); the JSON keeps every round. For each exchange route the run also
records the embedded service's peak resident memory (``VmHWM`` of its process, read before it is stopped) and
the bytes it had spilled to disk when the consumer finished (``status``: ``disk.used``), so the table shows
where the exchange starts to spill under the memory budget and what it costs after. With more than one scale
factor the run draws the cost curve: each route's median over the parquet route's, against the scale factor
(``--plot``, a PNG; needs matplotlib, in the ``bench`` extra).

Run: .venv/bin/python benchmarks/tpch_pipeline.py --sf 1 5 10 [--queries 3,5,9,10,18] [--repeat 3]
         [--routes pipelined,pipelined-jvm,jvm,jvm-none,format,jvm-concurrent,format-concurrent,pipelined-concurrent,parquet,one-app,noop-producer] [--shuffle-partitions 200]
         [--conf KEY=VALUE ...]
Quick check: .venv/bin/python benchmarks/tpch_pipeline.py --sf 0.1 --queries 3 --repeat 1
Writes benchmarks/tpch_pipeline-latest.json.
The curve of several runs (say one per scale factor): .venv/bin/python benchmarks/tpch_pipeline.py --replot a.json b.json
         [--routes ...] [--plot curve.png]
"""
from __future__ import annotations

import argparse
import datetime
import decimal
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / ".tpch"
TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")
ROUTES = ("pipelined", "pipelined-jvm", "jvm", "jvm-none", "format", "jvm-concurrent", "format-concurrent", "pipelined-concurrent",
          "parquet", "one-app", "noop-producer")
CATALOG = "org.sparkflow.exchange.catalog.ExchangeCatalog"
APP_TIMEOUT = 3600  # seconds for one application

# Each query: the original TPC-H text (DuckDB's reference answer), the producer half, the key the exchange
# is hashed on, and the consumer half, which reads the producer's rows as the view ``exchanged``.
QUERIES: dict[int, dict[str, str]] = {
    3: {
        "tpch": """
            select l_orderkey, sum(l_extendedprice * (1 - l_discount)) as revenue, o_orderdate, o_shippriority
            from customer, orders, lineitem
            where c_mktsegment = 'BUILDING' and c_custkey = o_custkey and l_orderkey = o_orderkey
              and o_orderdate < date '1995-03-15' and l_shipdate > date '1995-03-15'
            group by l_orderkey, o_orderdate, o_shippriority
            order by revenue desc, o_orderdate
            limit 10""",
        "producer": """
            select l_orderkey, l_extendedprice * (1 - l_discount) as volume
            from lineitem
            where l_shipdate > date '1995-03-15'""",
        "key": "l_orderkey",
        "consumer": """
            select l_orderkey, sum(volume) as revenue, o_orderdate, o_shippriority
            from customer, orders, exchanged
            where c_mktsegment = 'BUILDING' and c_custkey = o_custkey and l_orderkey = o_orderkey
              and o_orderdate < date '1995-03-15'
            group by l_orderkey, o_orderdate, o_shippriority
            order by revenue desc, o_orderdate
            limit 10""",
    },
    5: {
        "tpch": """
            select n_name, sum(l_extendedprice * (1 - l_discount)) as revenue
            from customer, orders, lineitem, supplier, nation, region
            where c_custkey = o_custkey and l_orderkey = o_orderkey and l_suppkey = s_suppkey
              and c_nationkey = s_nationkey and s_nationkey = n_nationkey and n_regionkey = r_regionkey
              and r_name = 'ASIA' and o_orderdate >= date '1994-01-01' and o_orderdate < date '1995-01-01'
            group by n_name
            order by revenue desc""",
        "producer": """
            select o_custkey, l_suppkey, l_extendedprice * (1 - l_discount) as volume
            from orders, lineitem
            where l_orderkey = o_orderkey and o_orderdate >= date '1994-01-01' and o_orderdate < date '1995-01-01'""",
        "key": "o_custkey",
        "consumer": """
            select n_name, sum(volume) as revenue
            from customer, exchanged, supplier, nation, region
            where c_custkey = o_custkey and l_suppkey = s_suppkey and c_nationkey = s_nationkey
              and s_nationkey = n_nationkey and n_regionkey = r_regionkey and r_name = 'ASIA'
            group by n_name
            order by revenue desc""",
    },
    9: {
        "tpch": """
            select nation, o_year, sum(amount) as sum_profit
            from (select n_name as nation, extract(year from o_orderdate) as o_year,
                         l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity as amount
                  from part, supplier, lineitem, partsupp, orders, nation
                  where s_suppkey = l_suppkey and ps_suppkey = l_suppkey and ps_partkey = l_partkey
                    and p_partkey = l_partkey and o_orderkey = l_orderkey and s_nationkey = n_nationkey
                    and p_name like '%green%') as profit
            group by nation, o_year
            order by nation, o_year desc""",
        "producer": """
            select l_orderkey, n_name as nation,
                   l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity as amount
            from part, supplier, lineitem, partsupp, nation
            where s_suppkey = l_suppkey and ps_suppkey = l_suppkey and ps_partkey = l_partkey
              and p_partkey = l_partkey and s_nationkey = n_nationkey and p_name like '%green%'""",
        "key": "l_orderkey",
        "consumer": """
            select nation, o_year, sum(amount) as sum_profit
            from (select nation, extract(year from o_orderdate) as o_year, amount
                  from orders, exchanged
                  where o_orderkey = l_orderkey) as profit
            group by nation, o_year
            order by nation, o_year desc""",
    },
    10: {
        "tpch": """
            select c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) as revenue, c_acctbal, n_name,
                   c_address, c_phone, c_comment
            from customer, orders, lineitem, nation
            where c_custkey = o_custkey and l_orderkey = o_orderkey and o_orderdate >= date '1993-10-01'
              and o_orderdate < date '1994-01-01' and l_returnflag = 'R' and c_nationkey = n_nationkey
            group by c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
            order by revenue desc
            limit 20""",
        "producer": """
            select o_custkey, l_extendedprice * (1 - l_discount) as volume
            from orders, lineitem
            where l_orderkey = o_orderkey and o_orderdate >= date '1993-10-01' and o_orderdate < date '1994-01-01'
              and l_returnflag = 'R'""",
        "key": "o_custkey",
        "consumer": """
            select c_custkey, c_name, sum(volume) as revenue, c_acctbal, n_name, c_address, c_phone, c_comment
            from customer, exchanged, nation
            where c_custkey = o_custkey and c_nationkey = n_nationkey
            group by c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
            order by revenue desc
            limit 20""",
    },
    18: {
        "tpch": """
            select c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) as sum_qty
            from customer, orders, lineitem
            where o_orderkey in (select l_orderkey from lineitem group by l_orderkey having sum(l_quantity) > 300)
              and c_custkey = o_custkey and o_orderkey = l_orderkey
            group by c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
            order by o_totalprice desc, o_orderdate
            limit 100""",
        "producer": """
            select l_orderkey, l_quantity
            from lineitem""",
        "key": "l_orderkey",
        "consumer": """
            select c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) as sum_qty
            from customer, orders, exchanged
            where o_orderkey in (select l_orderkey from exchanged group by l_orderkey having sum(l_quantity) > 300)
              and c_custkey = o_custkey and o_orderkey = l_orderkey
            group by c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
            order by o_totalprice desc, o_orderdate
            limit 100""",
    },
}


# ---------------------------------------------------------------- one application (a child process)

def _plain(value):
    """A result value as JSON: decimals and doubles as floats, dates as ISO text."""
    if isinstance(value, (decimal.Decimal, float)):
        return float(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return value


def _shuffles(df) -> list[str]:
    """The shuffles of ``df``'s executed plan (``Exchange`` nodes; broadcasts and reuses not counted); of an
    adaptive plan, its final plan."""
    text = df._jdf.queryExecution().executedPlan().toString().split("== Initial Plan ==")[0]
    return [line.strip() for line in text.splitlines() if re.search(r"\bExchange\s", line)]


def _child(args) -> dict:
    """One application: ``role`` produce (into ``--io``), consume (from ``--io``) or whole."""
    from pyspark.sql import SparkSession

    import sparkflow_exchange
    from sparkflow_exchange import SPARK_SETTINGS

    started = time.perf_counter()
    query = QUERIES[args.query]
    builder = (SparkSession.builder.master("local[2]").appName(f"tpch-q{args.query}-{args.role}-{args.io}")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", args.driver_memory)
               .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
               .config(map=SPARK_SETTINGS))
    for setting in args.conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    if args.io in ("format", "format-wait"):  # the jar serves format("pipelined")
        builder = builder.config("spark.jars", sparkflow_exchange.plugin_jar())
    if args.io in ("jvm", "jvm-wait", "jvm-none"):  # the JVM catalog: reads (and the jvm route's writes), no Python worker
        builder = (builder.config("spark.jars", sparkflow_exchange.plugin_jar())
                   .config("spark.sql.catalog.exchange", CATALOG)
                   .config("spark.sql.sources.v2.bucketing.shuffle.enabled", "true"))
    if args.io == "jvm-wait":  # started with its producer: loading the table waits for the exchange's commit
        builder = builder.config("spark.sql.catalog.exchange.commitTimeout", str(APP_TIMEOUT))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - started
    for table in TABLES:
        spark.read.parquet(str(Path(args.data) / f"{table}.parquet")).createOrReplaceTempView(table)
    out: dict = {"session_s": session_s}
    if args.role == "produce":
        df = spark.sql(query["producer"])
        if args.io == "parquet":
            df.write.mode("overwrite").parquet(args.path)
        elif args.io == "noop":
            df.write.format("noop").mode("overwrite").save()
        elif args.io in ("jvm", "jvm-none"):
            # the JVM writer finds the host's service and starts none: this driver starts it
            from sparkflow_exchange.config import ExchangeConfig
            from sparkflow_exchange.service.discovery import resolve

            resolve(ExchangeConfig.load())
            writer = df.writeTo(f"exchange.{args.exchange}").tableProperty("keys", query["key"]) \
                .tableProperty("numSubpartitions", str(args.shuffle_partitions))
            if args.io == "jvm-none":
                writer = writer.tableProperty("compression", "none")
            writer.createOrReplace()
        else:
            (df.write.format("pipelined").mode("overwrite").option("exchange", args.exchange)
             .option("partitioner", "hash").option("keys", query["key"])
             .option("numSubpartitions", str(args.shuffle_partitions)).save())
        out["shuffles"] = _shuffles(df)
    else:
        if args.role == "whole":
            spark.sql(query["producer"]).createOrReplaceTempView("exchanged")
        elif args.io == "parquet":
            spark.read.parquet(args.path).createOrReplaceTempView("exchanged")
        elif args.io in ("jvm", "jvm-wait"):
            spark.table(f"exchange.{args.exchange}").createOrReplaceTempView("exchanged")
        else:
            reader = spark.read.format("pipelined").option("exchange", args.exchange)
            if args.io in ("concurrent", "format-wait"):
                reader = reader.option("declareTimeout", str(APP_TIMEOUT))
            reader.load().createOrReplaceTempView("exchanged")
        df = spark.sql(query["consumer"])
        out["rows"] = [[_plain(v) for v in row] for row in df.collect()]
        out["shuffles"] = _shuffles(df)
    out["work_s"] = time.perf_counter() - started - session_s
    from spark_common import cpu_seconds  # benchmarks/ is this script's own directory

    out["jvm_cpu_s"] = cpu_seconds(int(spark._jvm.java.lang.ProcessHandle.current().pid()))
    spark.stop()
    return out


# ---------------------------------------------------------------- the driver of the run

def _sf_name(sf: float) -> str:
    return f"sf{sf:g}"


def lineitem_batches(path: Path | str, rows: int) -> list:
    """The first ``rows`` rows of a ``lineitem.parquet`` as record batches of plain strings (tpchgen-cli writes
    string_view columns, which pyarrow's take, the hash writer's gather, does not take)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    batches, n = [], 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
        batches.append(batch.slice(0, min(batch.num_rows, rows - n)))
        n += batches[-1].num_rows
        if n >= rows:
            break
    schema = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f for f in batches[0].schema])
    return [b.cast(schema) for b in batches]


def ensure_data(sf: float) -> Path:
    """The TPC-H tables at ``sf`` as parquet in benchmarks/.tpch/sf<sf>, generated once."""
    target = DATA / _sf_name(sf)
    if all((target / f"{t}.parquet").exists() for t in TABLES):
        return target
    tool = Path(sys.executable).parent / "tpchgen-cli"
    if not tool.exists():
        tool = shutil.which("tpchgen-cli")
        if tool is None:
            sys.exit("tpchgen-cli is missing: .venv/bin/python -m pip install tpchgen-cli")
    partial = DATA / (_sf_name(sf) + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"generating TPC-H sf {sf:g} into {target} ...", flush=True)
    start = time.perf_counter()
    subprocess.run([str(tool), "parquet", "--scale-factor", f"{sf:g}", "--output-dir", str(partial)], check=True)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    print(f"generated in {time.perf_counter() - start:.1f} s", flush=True)
    return target


def reference(data: Path, query: int) -> list[list]:
    """DuckDB's answer to the original TPC-H query on the same files."""
    import duckdb

    con = duckdb.connect()
    try:
        for table in TABLES:
            con.execute(f"create view {table} as select * from read_parquet('{data / (table + '.parquet')}')")
        return [[_plain(v) for v in row] for row in con.execute(QUERIES[query]["tpch"]).fetchall()]
    finally:
        con.close()


def _sort_key(row: list):
    """Rows in order of their non-numeric and integer values (the group keys), then their floats."""
    return ([repr(v) for v in row if not isinstance(v, float)], [v for v in row if isinstance(v, float)])


def differences(got: list[list], want: list[list]) -> list[str]:
    """What differs between two answers, compared as sorted rows, floats within 1e-6 relative."""
    if len(got) != len(want):
        return [f"{len(got)} rows, DuckDB has {len(want)}"]
    problems = []
    for index, (a, b) in enumerate(zip(sorted(got, key=_sort_key), sorted(want, key=_sort_key))):
        same = len(a) == len(b) and all(
            math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) if isinstance(x, float) and isinstance(y, (int, float))
            else x == y for x, y in zip(a, b))
        if not same:
            problems.append(f"row {index}: {a} != DuckDB's {b}")
    return problems[:10]


class Run:
    """The run's processes and directories: every application started here, and its cleanup."""

    def __init__(self, tmp: Path, args) -> None:
        self.tmp = tmp
        self.args = args
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.count = 0
        self.live: list[subprocess.Popen] = []  # applications started and not yet waited for

    def start(self, data: Path, query: int, role: str, io: str, exchange: str = "", path: str = ""):
        self.count += 1
        log = self.logs / f"{self.count:04d}-q{query}-{role}-{io}"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", role, "--io", io, "--query", str(query),
               "--data", str(data), "--exchange", exchange, "--path", path,
               "--shuffle-partitions", str(self.args.shuffle_partitions), "--driver-memory", self.args.driver_memory]
        for setting in self.args.conf:
            cmd += ["--conf", setting]
        out, err = open(f"{log}.out", "w"), open(f"{log}.err", "w")
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=self.tmp)
        self.live.append(proc)
        out.close()
        err.close()
        return proc, log, start

    def finish(self, started) -> dict:
        proc, log, start = started
        try:
            proc.wait(APP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by its pid
            proc.wait()
        seconds = time.perf_counter() - start
        self.live.remove(proc)
        text = Path(f"{log}.out").read_text()
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.exit(f"{log.name} failed (exit {proc.returncode}):\n{text[-2000:]}\n"
                     f"{Path(f'{log}.err').read_text()[-6000:]}")
        return {**json.loads(line[7:]), "wall_s": seconds}

    def app(self, *a, **kw) -> dict:
        return self.finish(self.start(*a, **kw))

    def route(self, data: Path, query: int, route: str, name: str) -> dict:
        """One route of one query: its applications' seconds, answer and plans."""
        os.sync()  # the previous route's dirty pages are not this one's to write back
        if route == "one-app":
            whole = self.app(data, query, "whole", "none")
            return {"seconds": whole["wall_s"], "apps": [whole], "rows": whole["rows"], "shuffles": whole["shuffles"]}
        if route == "noop-producer":
            alone = self.app(data, query, "produce", "noop")
            return {"seconds": alone["wall_s"], "apps": [alone], "rows": None, "shuffles": []}
        parquet = self.tmp / name
        try:
            if route in ("pipelined-concurrent", "jvm-concurrent", "format-concurrent"):
                sink, source = {"pipelined-concurrent": ("pipelined", "concurrent"), "jvm-concurrent": ("jvm", "jvm-wait"),
                                "format-concurrent": ("format", "format-wait")}[route]
                consumer = self.start(data, query, "consume", source, exchange=name)
                producer = self.start(data, query, "produce", sink, exchange=name)
                start = consumer[2]
                apps = [self.finish(producer), self.finish(consumer)]
                seconds = time.perf_counter() - start
            else:
                sink, source = {"pipelined": ("pipelined", "pipelined"), "pipelined-jvm": ("pipelined", "jvm"),
                                "jvm": ("jvm", "jvm"), "jvm-none": ("jvm-none", "jvm"), "format": ("format", "format"),
                                "parquet": ("parquet", "parquet")}[route]
                apps = [self.app(data, query, "produce", sink, exchange=name, path=str(parquet)),
                        self.app(data, query, "consume", source, exchange=name, path=str(parquet))]
                seconds = sum(a["wall_s"] for a in apps)
            result = {"seconds": seconds, "apps": apps, "rows": apps[1]["rows"], "shuffles": apps[1]["shuffles"],
                      "producer_shuffles": apps[0]["shuffles"]}
            if route != "parquet":
                result["exchange"] = self.drop(name)
            else:
                result["parquet_bytes"] = sum(f.stat().st_size for f in parquet.rglob("*") if f.is_file())
            return result
        finally:
            shutil.rmtree(parquet, ignore_errors=True)
            if route != "parquet":
                self.stop_service()

    def end(self) -> None:
        """Stop the applications still running (a failed run), each by its pid."""
        for proc in self.live:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.wait()
        self.live.clear()

    def drop(self, name: str) -> dict:
        """Drop the route's exchange (after its consumer); returns its size, the bytes the service had spilled
        and its peak resident memory so far."""
        import sparkflow_exchange

        summary = next((s for s in sparkflow_exchange.list_exchanges() if s.name == name), None)
        service = self.service_usage()
        sparkflow_exchange.drop_exchange(name)
        size = {} if summary is None else {"rows": summary.rows, "bytes": summary.bytes, "producers": summary.producers,
                                           "subpartitions": summary.num_subpartitions}
        return {**size, **service}

    def service_usage(self) -> dict:
        """The embedded service's peak resident memory (``VmHWM``, MiB) and the bytes of spill files it holds."""
        from sparkflow_exchange.service.launcher import read_state

        usage: dict = {}
        info = read_state(self.tmp / "runtime" / "embedded.json")
        if info is not None:
            try:
                for line in Path(f"/proc/{info['pid']}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        usage["service_peak_mib"] = round(int(line.split()[1]) / 1024, 1)
            except OSError:
                pass
            from spark_common import cpu_seconds  # on sys.path since main()

            usage["service_cpu_s"] = cpu_seconds(info["pid"])
        status = subprocess.run([sys.executable, "-m", "sparkflow_exchange.cli", "status", "--json"],
                                capture_output=True, text=True, timeout=60)
        if status.returncode == 0:
            services = json.loads(status.stdout)
            usage["spilled_bytes"] = sum(s.get("disk", {}).get("used", 0) for s in services)
            usage["memory_budget"] = max((s["memory"]["budget"] for s in services), default=None)
        return usage

    def stop_service(self) -> None:
        """Stop the embedded service the route's producer started (by the pid in its state file)."""
        from sparkflow_exchange.service.process import stop_embedded

        stop_embedded(self.tmp / "runtime")


def busy_cpu_seconds() -> float:
    """CPU-seconds every core of this machine has spent busy since boot (/proc/stat: user, nice, system, irq,
    softirq). On a machine running nothing else, the difference over a route is what its applications and the
    exchange service used."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _free_write(by_route: dict) -> float | None:
    """The ``jvm`` route's median pair with its producer replaced by the ``noop`` one: a write that costs
    nothing."""
    if "noop-producer" not in by_route or "jvm" not in by_route:
        return None
    return (_median(o["seconds"] for o in by_route["noop-producer"])
            + _median(o["apps"][1]["wall_s"] for o in by_route["jvm"]))


def plot_curve(summary: dict, routes: list[str], path: Path) -> bool:
    """Each route's median over the parquet route's against the scale factor, one panel per query (a PNG);
    False when matplotlib is missing or the run has fewer than two scale factors."""
    try:
        import matplotlib
    except ImportError:
        print("no plot: matplotlib is missing (.venv/bin/python -m pip install -e '.[bench]')", flush=True)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sfs = sorted(summary, key=float)
    queries = sorted({q for by_q in summary.values() for q in by_q}, key=lambda q: int(q[1:]))
    if len(sfs) < 2 or not queries:
        return False
    fig, axes = plt.subplots(1, len(queries), figsize=(4.2 * len(queries), 3.8), sharey=True, squeeze=False)
    for ax, q in zip(axes[0], queries):
        for route in routes:
            if route == "parquet":
                continue
            points = [(float(sf), summary[sf][q]["median_s"].get(route), summary[sf][q]["median_s"].get("parquet"))
                      for sf in sfs if q in summary[sf]]
            xs = [x for x, r, p in points if r and p]
            ys = [r / p for x, r, p in points if r and p]
            if xs:
                ax.plot(xs, ys, marker="o", label=route)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_xticks([float(sf) for sf in sfs], [sf for sf in sfs])
        ax.minorticks_off()
        ax.set_title(f"TPC-H {q}")
        ax.set_xlabel("scale factor")
    axes[0][0].set_ylabel("route time / parquet route's (median)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sf", type=float, nargs="+", default=[1.0], help="scale factor(s), e.g. --sf 1 5")
    parser.add_argument("--queries", default=",".join(map(str, QUERIES)), help="e.g. 3,9,10,18")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--plot", type=Path, default=HERE / "tpch_pipeline-curve.png",
                        help="where the cost curve goes (a PNG; with two or more scale factors)")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--shuffle-partitions", type=int, default=200,
                        help="spark.sql.shuffle.partitions of every application and the exchange's numSubpartitions")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for every application (repeatable)")
    parser.add_argument("--replot", type=Path, nargs="+", metavar="JSON",
                        help="no run: draw the cost curve (--plot) from the summaries of earlier runs' JSON files "
                             "(e.g. one per scale factor), of the routes given by --routes that they have")
    parser.add_argument("--child", choices=("produce", "consume", "whole"), help=argparse.SUPPRESS)
    parser.add_argument("--io", help=argparse.SUPPRESS)
    parser.add_argument("--query", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--exchange", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.role = args.child
        print("RESULT " + json.dumps(_child(args)), flush=True)
        return
    queries = [int(q) for q in args.queries.split(",") if q.strip()]
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    if args.replot:
        summary = {}
        for path in args.replot:
            summary.update(json.loads(path.read_text())["summary"])
        have = {r for by_q in summary.values() for q in by_q.values() for r in q["median_s"]}
        if plot_curve(summary, [r for r in routes if r in have], args.plot):
            print(f"cost curve of scale factors {', '.join(sorted(summary, key=float))}: {args.plot}")
        else:
            sys.exit("no plot: the files hold fewer than two scale factors (or matplotlib is missing)")
        return
    for q in queries:
        if q not in QUERIES:
            parser.error(f"query {q} is not written here: {sorted(QUERIES)}")
    for r in routes:
        if r not in ROUTES:
            parser.error(f"unknown route {r!r}: {', '.join(ROUTES)}")

    sys.path.insert(0, str(HERE))
    from spark_common import bench_environment, end_run

    datasets = {sf: ensure_data(sf) for sf in args.sf}
    expected = {}
    for sf, data in datasets.items():
        for q in queries:
            expected[sf, q] = reference(data, q)
            print(f"sf {sf:g} Q{q}: DuckDB's answer has {len(expected[sf, q])} rows", flush=True)
    tmp = bench_environment("tpch")
    run = Run(tmp, args)
    load_before = os.getloadavg()
    results: dict = {}
    try:
        for sf, data in datasets.items():
            for round_ in range(args.repeat):
                for q in queries:
                    # interleaved, in reverse every other round: a slow spell or a drift of the machine falls on
                    # every route alike
                    for route in routes if round_ % 2 == 0 else routes[::-1]:
                        name = f"tpch_sf{sf:g}_q{q}_{route}_{round_}".replace(".", "_").replace("-", "_")
                        cpu = busy_cpu_seconds()
                        outcome = run.route(data, q, route, name)
                        outcome["cpu_s"] = round(busy_cpu_seconds() - cpu, 1)
                        rows = outcome.pop("rows")
                        wrong = [] if rows is None else differences(rows, expected[sf, q])
                        if wrong:
                            sys.exit(f"WRONG ANSWER: sf {sf:g} Q{q} route {route}, round {round_ + 1}:\n  "
                                     + "\n  ".join(wrong))
                        for a in outcome["apps"]:
                            a.pop("rows", None)
                        results.setdefault(f"{sf:g}", {}).setdefault(f"Q{q}", {}).setdefault(route, []).append(outcome)
                        parts = " + ".join(f"{a['wall_s']:.1f}" for a in outcome["apps"])
                        jvm_cpu = " + ".join(_cell(a.get("jvm_cpu_s"), ".1f") for a in outcome["apps"])
                        service_cpu = outcome.get("exchange", {}).get("service_cpu_s")
                        print(f"sf {sf:g} round {round_ + 1} Q{q} {route}: {outcome['seconds']:.1f} s ({parts}), "
                              f"{outcome['cpu_s']:.1f} busy CPU-s (JVMs {jvm_cpu}"
                              + ("" if service_cpu is None else f", service {service_cpu:.1f}") + "); "
                              f"consumer shuffles {len(outcome['shuffles'])}"
                              + ("" if rows is None else "; answer checked"), flush=True)
    finally:
        run.end()
        end_run(None, tmp)
    load_after = os.getloadavg()

    summary: dict = {}
    header = ("| sf | query | " + " | ".join(routes) + " | pipelined/parquet | pipelined-jvm/parquet | jvm/parquet | jvm/jvm-none | format/parquet | "
              "jvm-concurrent/parquet | format-concurrent/parquet | pipelined-concurrent/parquet | pipelined/one-app | "
              "jvm/one-app | jvm-concurrent/one-app | format-concurrent/one-app | jvm-free-write/parquet | consumer shuffles (pipelined / jvm / format / parquet) |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    cpu_header = "| sf | query | " + " | ".join(routes) + " |"
    cpu_lines = [cpu_header, "|" + "---|" * (cpu_header.count("|") - 1)]
    service_lines = ["| sf | query | route | exchange MB | service peak MiB | spilled MB |", "|---|---|---|---|---|---|"]
    for sf_name, by_query in results.items():
        for q_name, by_route in by_query.items():
            median = {r: _median(o["seconds"] for o in outs) for r, outs in by_route.items()}
            spread = {r: [min(o["seconds"] for o in outs), max(o["seconds"] for o in outs)]
                      for r, outs in by_route.items()}
            service = {r: {"peak_mib": _median(o.get("exchange", {}).get("service_peak_mib") for o in outs),
                           "spilled_mb": _median((o.get("exchange", {}).get("spilled_bytes") or 0) / 1e6
                                                 for o in outs if "exchange" in o),
                           "exchange_mb": _median((o.get("exchange", {}).get("bytes") or 0) / 1e6
                                                  for o in outs if "exchange" in o)}
                       for r, outs in by_route.items() if any("exchange" in o for o in outs)}
            shuffles = {r: len(outs[0]["shuffles"]) for r, outs in by_route.items()}
            ratios = {"pipelined/parquet": _ratio(median.get("pipelined"), median.get("parquet")),
                      "pipelined-jvm/parquet": _ratio(median.get("pipelined-jvm"), median.get("parquet")),
                      "jvm/parquet": _ratio(median.get("jvm"), median.get("parquet")),
                      "jvm/jvm-none": _ratio(median.get("jvm"), median.get("jvm-none")),
                      "format/parquet": _ratio(median.get("format"), median.get("parquet")),
                      "jvm-concurrent/parquet": _ratio(median.get("jvm-concurrent"), median.get("parquet")),
                      "format-concurrent/parquet": _ratio(median.get("format-concurrent"), median.get("parquet")),
                      "pipelined-concurrent/parquet": _ratio(median.get("pipelined-concurrent"), median.get("parquet")),
                      "pipelined/one-app": _ratio(median.get("pipelined"), median.get("one-app")),
                      "jvm/one-app": _ratio(median.get("jvm"), median.get("one-app")),
                      "jvm-concurrent/one-app": _ratio(median.get("jvm-concurrent"), median.get("one-app")),
                      "format-concurrent/one-app": _ratio(median.get("format-concurrent"), median.get("one-app")),
                      "jvm-free-write/parquet": _ratio(_free_write(by_route), median.get("parquet"))}
            cpu = {r: _median(o["cpu_s"] for o in outs) for r, outs in by_route.items()}
            summary.setdefault(sf_name, {})[q_name] = {"median_s": median, "min_max_s": spread, "ratios": ratios,
                                                       "consumer_shuffles": shuffles, "busy_cpu_s": cpu,
                                                       "service": service}
            for r, use in service.items():
                service_lines.append(f"| {sf_name} | {q_name} | {r} | {_cell(use['exchange_mb'], '.0f')} | "
                                     f"{_cell(use['peak_mib'], '.0f')} | {_cell(use['spilled_mb'], '.0f')} |")
            cpu_lines.append(f"| {sf_name} | {q_name} | " + " | ".join(_cell(cpu.get(r), ".1f") for r in routes) + " |")
            lines.append(f"| {sf_name} | {q_name} | " + " | ".join(_cell(median.get(r), ".1f") for r in routes) + " | "
                         + " | ".join(_cell(v, ".2f") for v in ratios.values()) + " | "
                         + " / ".join(str(shuffles.get(r, "–")) for r in ("pipelined", "jvm", "format", "parquet"))
                         + " |")
    print(f"\nmedian of {args.repeat}, seconds per route (every application's wall clock, session start included); "
          f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}; "
          f"spark.sql.shuffle.partitions = numSubpartitions = {args.shuffle_partitions}\n")
    print("\n".join(lines))
    print("\nbusy CPU-seconds of the machine per route (median of the rounds)\n")
    print("\n".join(cpu_lines))
    print("\nthe embedded service per exchange route (medians): the exchange's bytes, the service's peak resident "
          "memory, the bytes it had spilled when the consumer finished\n")
    print("\n".join(service_lines))
    if len(args.sf) > 1 and plot_curve(summary, routes, args.plot):
        print(f"\ncost curve: {args.plot}")
    out = {"sf": args.sf, "queries": queries, "routes": routes, "repeat": args.repeat,
           "shuffle_partitions": args.shuffle_partitions, "driver_memory": args.driver_memory, "conf": args.conf,
           "summary": summary, "runs": results, "load_before": load_before, "load_after": load_after}
    (HERE / "tpch_pipeline-latest.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
