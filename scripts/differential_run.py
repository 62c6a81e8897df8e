"""The differential tester's steps: writes by every writer, reads by every reader, each read compared with the
model of the committed state (``differential_data.ExchangeModel``). Used by ``differential.py``.

Writers: ``py`` (the Python data source: ``format("pipelined")`` with ``jvmFormat=false``), ``jar`` (the jar's
``format("pipelined")``), ``catalog`` (``df.writeTo("exchange.<name>")``), ``ow`` (``open_writer``).
Readers: ``py``, ``jar``, ``catalog`` (``spark.table("exchange.<name>")``), ``ow`` (``open_reader``).
"""
from __future__ import annotations

import datetime as dt
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import pyarrow as pa
from differential_data import (
    COLLATED,
    FILTER_TYPES,
    ExchangeModel,
    Features,
    Layout,
    canon_rows,
    other_layouts,
    random_layout,
    random_rows,
    show_row,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

import sparkflow_exchange as sfe

WRITERS = ("py", "jar", "catalog", "ow")  # the writers (_write), for reference
READ_WAIT = "5"  # declareTimeout of a read: the model knows the exchange exists, a lost one is not waited for long
READERS = ("py", "jar", "catalog", "ow")
CLEAR_WORDS = ("layout", "schema", "keys", "key ", "partitioner", "numsubpartitions", "subpartitions", "width",
               "column", "exists", "buffersize", "partitiontype", "append", "not found", "unknown", "bad pool")


# partitioners whose exchanges the jar's format("pipelined") appends to in the JVM (the ones its reader reads)
JVM_APPENDS = ("hash", "rebalance")


@dataclass
class Discrepancy:
    """A wrong answer (or an error where the model says the operation must succeed, or a success where it must
    fail), with what is needed to see it again: the seed, the step and the exchange's operations."""
    kind: str
    step: int
    exchange: str
    operations: list[str]
    writer: str = ""
    reader: str = ""
    expected: str = ""
    got: str = ""
    rows: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"[{self.kind}] step {self.step}, exchange {self.exchange!r}"
                 + (f", writer {self.writer}" if self.writer else "") + (f", reader {self.reader}" if self.reader else ""),
                 f"  operations: {' ; '.join(self.operations[-8:])}",
                 f"  expected: {self.expected}", f"  got:      {self.got}"]
        lines += [f"    {row}" for row in self.rows[:6]]
        return "\n".join(lines)


class OperationFailed(Exception):
    """An operation the model expects to succeed raised: carries its short message."""


def first_line(exc: BaseException) -> str:
    """The line of an error that says what went wrong (Spark wraps the package's errors in its own text)."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for test in (lambda ln: "sparkflow_exchange." in ln or "org.sparkflow." in ln,
                 lambda ln: re.search(r"(Error|Exception): \S", ln) and "exception was thrown" not in ln
                 and "An error occurred while calling" not in ln):
        for ln in lines:
            if test(ln):
                return ln[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]


def clear_error(exc: BaseException, name: str) -> bool:
    """An error a user can act on: the package's own class, or a message naming the exchange or what was wrong."""
    if isinstance(exc, (sfe.ConfigError, sfe.ExchangeError)):
        return True
    text = str(exc).lower()
    if "nullpointerexception" in text or not text.strip():
        return False
    return "sparkflow_exchange." in text or name.lower() in text or any(w in text for w in CLEAR_WORDS)


class Runner:
    """Random operations on a few exchange names in one Spark session, every read checked against the model."""

    def __init__(self, spark: SparkSession, seed: int, features: Features, prefix: str,
                 log: Callable[[str], None] = print, verbose: bool = False) -> None:
        self.spark = spark
        self.seed = seed
        self.r = random.Random(seed)
        self.features = features
        self.names = [f"{prefix}{i}" for i in range(3)]
        self.models: dict[str, ExchangeModel | None] = {n: None for n in self.names}
        self.history: dict[str, list[str]] = {n: [] for n in self.names}
        self.found: list[Discrepancy] = []
        self.counts: Counter[str] = Counter()
        self.log = log
        self.verbose = verbose
        self.step_no = 0
        self._expected_cache: dict[tuple, tuple] = {}

    # ------------------------------------------------------------------ steps
    def step(self) -> None:
        self.step_no += 1
        r = self.r
        name = r.choice(self.names)
        model = self.models[name]
        if model is None:
            self.op_create(name)
        else:
            ops = [(self.op_append, 30), (self.op_overwrite, 18), (self.op_drop, 8), (self.op_bad_overwrite, 8),
                   (self.op_create_existing, 5)]
            if self.features.other_layout_append:
                ops.append((self.op_other_layout_append, 15))
            op = r.choices([o for o, _ in ops], [w for _, w in ops])[0]
            op(name)
        model = self.models[name]
        if model is not None:
            readers = list(READERS) if r.random() < 0.2 else self._least_used("try-read", list(READERS), 2)
            for reader in readers:
                if self.models[name] is None:
                    break
                self.check_read(name, reader)
        elif self.history[name] and self.history[name][-1].startswith("drop") and r.random() < 0.3:
            self.check_dropped(name)

    def _least_used(self, kind: str, options: list[str], count: int = 1) -> list[str]:
        """``count`` of ``options`` used least so far (ties at random): every writer and reader takes part in a
        short run, whatever the operations before did."""
        ranked = sorted(options, key=lambda o: (self.counts[f"{kind}:{o}"], self.r.random()))[:count]
        for o in ranked:
            self.counts[f"{kind}:{o}"] += 1
        return ranked

    def _note(self, name: str, text: str) -> None:
        self.history[name].append(text)
        self.counts["operations"] += 1
        if self.verbose:
            self.log(f"  step {self.step_no}: {name}: {text}")

    def _report(self, d: Discrepancy) -> None:
        self.found.append(d)
        self.log(d.text())
        self._reset(d.exchange)

    def _reset(self, name: str) -> None:
        """After a discrepancy the exchange's state is unknown: drop it and start it again."""
        try:
            sfe.drop_exchange(name)
        except Exception:  # noqa: BLE001 - it may not exist
            pass
        self.models[name] = None
        self.history[name].append("drop (reset after the discrepancy)")

    # ------------------------------------------------------------------ data and writes
    def _dataframe(self, layout: Layout, table: pa.Table, producers: int) -> DataFrame:
        spark = self.spark
        if not layout.columns:
            df = spark.range(table.num_rows).select()
        else:
            plain = ", ".join(f"`{c.name}` {'STRING' if c.type is COLLATED else c.type.ddl}" for c in layout.columns)
            df = spark.createDataFrame(table, schema=StructType.fromDDL(plain))
            for c in layout.columns:
                if c.type is COLLATED:
                    df = df.withColumn(c.name, F.collate(F.col(f"`{c.name}`"), "UTF8_LCASE"))
        return df.repartition(producers)

    def arrow_schema(self, layout: Layout) -> pa.Schema:
        """The Arrow schema a Spark writer declares for ``layout``'s columns (``to_arrow_schema``, UTC): what an
        ``open_writer`` of the same exchange must bring (Spark names a list's element ``element``)."""
        if not layout.columns:
            return pa.schema([])
        plain = ", ".join(f"`{c.name}` {c.type.ddl}" for c in layout.columns)
        return to_arrow_schema(StructType.fromDDL(plain), timezone="UTC")

    def _rows(self, layout: Layout) -> pa.Table:
        r = self.r
        count = r.choice([0, 1, 5, 20, 50, 100, 200, 400]) if r.random() < 0.9 else r.randint(500, 2000)
        if layout.partitioner == "forward":  # Spark makes an empty DataFrame one partition, whatever repartition says
            count = max(count, layout.n)
        return random_rows(r, layout, count)

    def _pick_writer(self, layout: Layout, mode: str) -> str:
        return self._least_used("try-write", self._writers_for(layout, mode))[0]

    def _writers_for(self, layout: Layout, mode: str) -> list[str]:
        out = ["py", "jar", "catalog"]
        # open_writer is one producer: a forward exchange of n > 1 needs n; an Arrow schema carries no collation
        if not layout.collated and (layout.partitioner != "forward" or layout.n == 1) and layout.columns:
            out.append("ow")
        return out

    def _write(self, writer: str, name: str, layout: Layout, table: pa.Table, mode: str,
               extra: dict[str, str] | None = None) -> None:
        """One write; ``mode``: overwrite, append or create (fails if the exchange exists)."""
        extra = dict(extra or {})
        if writer == "ow":
            schema = self.arrow_schema(layout)
            table = table.cast(schema)
            with sfe.open_writer(name, schema, partitioner=layout.partitioner, keys=list(layout.keys),
                                 num_subpartitions=layout.n, mode="append" if mode == "append" else "overwrite",
                                 partitionType=layout.partition_type, **extra) as w:
                w.write(table)
            return
        producers = layout.n if layout.partitioner == "forward" else self.r.randint(1, 3)
        df = self._dataframe(layout, table, producers)
        options = {"partitioner": layout.partitioner, "numSubpartitions": str(layout.n),
                   "partitionType": layout.partition_type}
        if layout.keys:
            options["keys"] = ",".join(layout.keys)
        options.update(extra)
        if writer == "catalog":
            w = df.writeTo(f"exchange.`{name}`")
            for k, v in options.items():
                w = w.option(k, v)
            {"overwrite": w.createOrReplace, "append": w.append, "create": w.create}[mode]()
            return
        w = df.write.format("pipelined").option("exchange", name)
        if writer == "py":
            w = w.option("jvmFormat", "false")
        for k, v in options.items():
            w = w.option(k, v)
        w.mode({"create": "errorifexists"}.get(mode, mode)).save()

    @staticmethod
    def _refusal(writer: str, layout: Layout, mode: str) -> str | None:
        """Why the model says this write must be refused (None: it must succeed)."""
        if layout.collated:  # an exchange keeps no collation: its readers would compare the column as plain strings
            return "a collated string column"
        if not layout.columns and writer == "py":  # Spark hands a Python writer no rows for it
            return "a DataFrame without columns through the Python data source"
        if not layout.columns and writer == "jar" and mode == "append" and layout.partitioner not in JVM_APPENDS:
            # the jar's format("pipelined") hands an append to an exchange its reader does not read to the Python
            # data source, which refuses rows without columns
            return "a DataFrame without columns appended through the Python data source"
        return None

    def _attempt(self, name: str, what: str, writer: str, fn: Callable[[], None],
                 layout: Layout | None = None, mode: str = "overwrite") -> bool:
        """Run an operation the model says succeeds (or, for what ``layout`` makes refused, must fail with a
        clear error and change nothing); an error is a discrepancy. True when it ran and succeeded."""
        refusal = self._refusal(writer, layout, mode) if layout is not None else None
        if refusal is not None:
            self._refused(name, f"{what} with {refusal}", writer, fn)
            return False
        started = time.monotonic()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - every error is reported
            self._note(name, f"{what} by {writer} FAILED")
            self._report(Discrepancy("unexpected_error", self.step_no, name, list(self.history[name]), writer=writer,
                                     expected="success", got=first_line(exc)))
            return False
        self.counts[f"write:{writer}"] += 1
        self._note(name, f"{what} by {writer} ({time.monotonic() - started:.1f}s)")
        return True

    def _refused(self, name: str, what: str, writer: str, fn: Callable[[], None]) -> None:
        """Run an operation the model says must fail with a clear error and change nothing."""
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the error is what is checked
            self.counts["refused"] += 1
            self._note(name, f"{what} by {writer}: refused")
            if not clear_error(exc, name):
                self._report(Discrepancy("unclear_error", self.step_no, name, list(self.history[name]), writer=writer,
                                         expected="an error naming the problem", got=first_line(exc)))
            return
        self._note(name, f"{what} by {writer}: ACCEPTED")
        self._report(Discrepancy("accepted_but_must_fail", self.step_no, name, list(self.history[name]),
                                 writer=writer, expected=f"{what} refused with an error", got="it succeeded"))

    def op_create(self, name: str) -> None:
        layout = random_layout(self.r, self.features)
        table = self._rows(layout)
        writer = self._pick_writer(layout, "overwrite")
        mode = self.r.choice(["create", "overwrite"]) if writer in ("jar", "catalog") else "overwrite"
        self.history[name] = []
        if self._attempt(name, f"{mode} {layout.describe()} {table.num_rows} rows", writer,
                         lambda: self._write(writer, name, layout, table, mode), layout, mode):
            self.models[name] = ExchangeModel(layout, [table])

    def op_overwrite(self, name: str) -> None:
        model = self.models[name]
        assert model is not None
        layout = model.layout if self.r.random() < 0.4 else random_layout(self.r, self.features)
        table = self._rows(layout)
        writer = self._pick_writer(layout, "overwrite")
        if self._attempt(name, f"overwrite {layout.describe()} {table.num_rows} rows", writer,
                         lambda: self._write(writer, name, layout, table, "overwrite"), layout):
            self.models[name] = ExchangeModel(layout, [table])

    def op_append(self, name: str) -> None:
        model = self.models[name]
        assert model is not None
        table = self._rows(model.layout)
        writer = self._pick_writer(model.layout, "append")
        if model.layout.partitioner == "forward":  # producer i is subpartition i: a second write has no room
            table = random_rows(self.r, model.layout, max(table.num_rows, model.layout.n))
            return self._refused(name, "append to a forward exchange", writer,
                                 lambda: self._write(writer, name, model.layout, table, "append"))
        if self._attempt(name, f"append {table.num_rows} rows", writer,
                         lambda: self._write(writer, name, model.layout, table, "append"), model.layout, "append"):
            model.tables.append(table)

    def op_other_layout_append(self, name: str) -> None:
        model = self.models[name]
        assert model is not None
        choices = other_layouts(self.r, model.layout)
        if not choices:
            return self.op_append(name)
        what, layout = self.r.choice(choices)
        table = self._rows(layout)
        if table.num_rows == 0:
            table = random_rows(self.r, layout, 10)
        writer = self._pick_writer(layout, "append")
        self._refused(name, f"append with {what} ({layout.describe()})", writer,
                      lambda: self._write(writer, name, layout, table, "append"))

    def op_bad_overwrite(self, name: str) -> None:
        model = self.models[name]
        assert model is not None
        layout = random_layout(self.r, self.features)
        table = random_rows(self.r, layout, 20)
        writer = self._pick_writer(layout, "overwrite")
        bad: list[tuple[str, Layout, dict[str, str]]] = [
            ("a key that is no column", replace(layout, partitioner="hash", keys=("no_such_column",)), {}),
            ("an unknown partition type", replace(layout, partition_type="SIDEWAYS"), {}),
        ]
        if self.features.failing_overwrite:
            bad.append(("bufferSize=1g", layout, {"bufferSize": "1g"}))
        if writer == "catalog" and not self.features.failing_replace_catalog:
            writer = "jar"
        what, layout, extra = self.r.choice(bad)
        self._refused(name, f"overwrite with {what}", writer,
                      lambda: self._write(writer, name, layout, table, "overwrite", extra))

    def op_create_existing(self, name: str) -> None:
        model = self.models[name]
        assert model is not None
        writer = self.r.choice(["jar", "catalog"])
        layout = model.layout if model.layout.collated or self.r.random() < 0.5 else random_layout(self.r, self.features)
        table = random_rows(self.r, layout, 10)
        self._refused(name, "create of an existing exchange", writer,
                      lambda: self._write(writer, name, layout, table, "create"))

    def op_drop(self, name: str) -> None:
        how = self.r.choice(["drop_exchange", "DROP TABLE"])

        def drop() -> None:
            if how == "drop_exchange":
                sfe.drop_exchange(name)
            else:
                self.spark.sql(f"DROP TABLE exchange.`{name}`")
        if self._attempt(name, f"drop ({how})", how, drop):
            self.models[name] = None

    def check_dropped(self, name: str) -> None:
        try:
            got = sfe.open_reader(name, declareTimeout="1").read_all()
        except sfe.ExchangeNotFound:
            self.counts["reads"] += 1
            return
        except Exception as exc:  # noqa: BLE001
            self._report(Discrepancy("unclear_error", self.step_no, name, list(self.history[name]), reader="ow",
                                     expected="ExchangeNotFound", got=first_line(exc)))
            return
        self._report(Discrepancy("read_of_dropped", self.step_no, name, list(self.history[name]), reader="ow",
                                 expected="ExchangeNotFound", got=f"{got.num_rows} rows"))

    # ------------------------------------------------------------------ reads
    def model_frame(self, model: ExchangeModel) -> DataFrame:
        table = pa.concat_tables(model.tables) if model.tables else random_rows(self.r, model.layout, 0)
        table = table.combine_chunks()  # createDataFrame(pyarrow.Table) drops every row after an empty chunk
        return self._dataframe(model.layout, table, 1)

    def _spark_read(self, reader: str, name: str, layout: Layout) -> tuple[DataFrame, bool]:
        """The read's DataFrame, and whether it must have exactly n partitions (one per subpartition)."""
        spark = self.spark
        jvm_layout = layout.partitioner in ("hash", "rebalance")
        exact = reader == "py" or self.r.random() < 0.5
        if reader == "py":
            return (spark.read.format("pipelined").option("exchange", name).option("jvmFormat", "false")
                    .option("declareTimeout", READ_WAIT).load(), True)
        if reader == "jar":
            rd = spark.read.format("pipelined").option("exchange", name).option("declareTimeout", READ_WAIT)
            if not jvm_layout:  # the Python source's layouts: readPartitions is the JVM reader's option
                return rd.load(), True
            if exact:
                rd = rd.option("readPartitions", str(layout.n))
            return rd.load(), exact
        if layout.partitioner == "broadcast" and not self.features.broadcast_catalog:
            exact = True
        rd = spark.read.option("readPartitions", str(layout.n)) if exact else spark.read
        return rd.table(f"exchange.`{name}`"), exact

    def check_read(self, name: str, reader: str) -> None:
        model = self.models[name]
        assert model is not None
        layout = model.layout
        if reader == "catalog" and layout.partitioner == "broadcast" and not self.features.broadcast_catalog:
            reader = "py"
        if reader == "catalog" and layout.partitioner == "forward":  # documented: the catalog refuses it, clearly
            self._refused(name, "read of a forward exchange", "catalog", lambda: self.spark.table(
                f"exchange.`{name}`").toArrow())
            self.history[name][-1] += " (a read: nothing to lose)"
            return
        self.counts[f"read:{reader}"] += 1
        self.counts["reads"] += 1
        started = time.monotonic()
        try:
            if reader == "ow":
                got, m, exact = self._ow_read(name, layout)
                df = None
            else:
                df, exact = self._spark_read(reader, name, layout)
                m = df.rdd.getNumPartitions()
                got = canon_rows(df.withColumn("__pid", F.spark_partition_id()).toArrow(), pid="__pid")
        except Exception as exc:  # noqa: BLE001
            self._report(Discrepancy(self._read_failure_kind(name), self.step_no, name, list(self.history[name]),
                                     reader=reader, expected=f"{model.rows} rows", got=first_line(exc)))
            return
        self.counts["rows_read"] += len(got)
        if self.verbose:
            self.log(f"    read by {reader}: {len(got)} rows in {m} partitions ({time.monotonic() - started:.1f}s)")
        if not self._compare(name, reader, model, got, m, exact):
            return
        if df is not None and model.rows and layout.partitioner != "broadcast" and self.r.random() < 0.6:
            self._check_filter(name, reader, model, df)

    def _read_failure_kind(self, name: str) -> str:
        """A read that fails right after a refused operation: the refusal lost the committed state."""
        last = self.history[name][-1] if self.history[name] else ""
        return "refusal_lost_state" if last.endswith(": refused") else "unexpected_error"

    def _ow_read(self, name: str, layout: Layout) -> tuple[list, int, bool]:
        if layout.partitioner == "broadcast" and self.r.random() < 0.5:  # all subpartitions at once: one copy
            return [(0, row) for row in canon_rows(sfe.open_reader(name, declareTimeout=READ_WAIT).read_all())], 1, False
        got = []
        for i in range(layout.n):
            got += [(i, row) for row in canon_rows(
                sfe.open_reader(name, subpartitions=i, declareTimeout=READ_WAIT).read_all())]
        return got, layout.n, True

    def _expected_placement(self, model: ExchangeModel, m: int) -> list:
        key = (id(model), len(model.tables), m)
        if self._expected_cache.get(key, (None,))[0] is not model:
            df = self.model_frame(model)
            placed = df.repartition(m, *[F.col(f"`{k}`") for k in model.layout.keys])
            self._expected_cache.clear()
            self._expected_cache[key] = (model, canon_rows(
                placed.withColumn("__pid", F.spark_partition_id()).toArrow(), pid="__pid"))
        return self._expected_cache[key][1]

    def _compare(self, name: str, reader: str, model: ExchangeModel, got: list, m: int, exact: bool) -> bool:
        layout = model.layout
        expected_rows = Counter(r for t in model.tables for r in canon_rows(t))
        def report(kind: str, expected: str, got_text: str, rows: list[str]) -> bool:
            if self._read_failure_kind(name) == "refusal_lost_state":
                got_text += " (right after a refused operation)"
            self._report(Discrepancy(kind, self.step_no, name, list(self.history[name]), reader=reader,
                                     expected=expected, got=got_text, rows=rows))
            return False

        if exact and m != layout.n:
            return report("wrong_width", f"{layout.n} read partitions", f"{m}", [])
        if any(p is None or not 0 <= p < max(m, 1) for p, _ in got):
            return report("bad_partition", f"partitions in [0, {m})", str(sorted({p for p, _ in got})[:10]), [])
        if layout.partitioner == "broadcast":
            by_pid: dict[int, Counter] = {}
            for p, row in got:
                by_pid.setdefault(p, Counter())[row] += 1
            want_pids = range(m) if model.rows else []
            for p in want_pids:
                have = by_pid.get(p, Counter())
                if have != expected_rows:
                    return report("broadcast_copy", f"read partition {p} of {m}: one copy, {model.rows} rows",
                                  f"{sum(have.values())} rows", _diff(expected_rows, have))
            return True
        have = Counter(row for _, row in got)
        if have != expected_rows:
            return report("wrong_rows", f"{model.rows} rows", f"{len(got)} rows", _diff(expected_rows, have))
        if layout.partitioner == "hash" and model.rows:
            want = Counter(self._expected_placement(model, m))
            placed = Counter(got)
            if placed != want:
                off = sum((placed - want).values())
                return report("misplaced", f"every row in its partition of repartition({m}, {', '.join(layout.keys)})",
                              f"{off} of {len(got)} rows elsewhere", _diff(want, placed))
        return True

    def _check_filter(self, name: str, reader: str, model: ExchangeModel, df: DataFrame) -> None:
        layout = model.layout
        filterable = [c for c in layout.columns if c.type.name in FILTER_TYPES or c.type is COLLATED]
        if not filterable:
            return
        table = self.r.choice([t for t in model.tables if t.num_rows])
        row = self.r.randrange(table.num_rows)
        value = lambda c: table.column(table.column_names.index(c)).to_pylist()[row]  # noqa: E731
        key_cols = [c for c in layout.columns if c.name in layout.keys]
        partner = {"k": "K", "K": "k"}
        names = {c.name: c for c in layout.columns}
        swapped = [names.get(partner.get(c.name, ""), c) for c in key_cols]
        if layout.partitioner == "hash" and swapped != key_cols and all(c in filterable for c in swapped) \
                and self.r.random() < 0.8:
            cols = swapped  # `k` where the exchange is hashed on `K` (or the other way): no pruning on it
        elif layout.partitioner == "hash" and all(c in filterable for c in key_cols) and self.r.random() < 0.6:
            cols = key_cols
        else:
            cols = [self.r.choice(filterable)]
        parts, texts = [], []
        for c in cols:
            v = value(c.name)
            if c.type is COLLATED and isinstance(v, str) and self.r.random() < 0.5:
                v = v.upper()
            col = F.col(f"`{c.name}`")
            if isinstance(v, bytes):
                lit = F.lit(bytearray(v))
            elif isinstance(v, dt.date) and not isinstance(v, dt.datetime):  # py4j's Date.valueOf misreads year 1
                lit = F.lit(v.isoformat()).cast("date")
            else:
                lit = F.lit(v)
            parts.append(col.eqNullSafe(lit) if v is None else col == lit)
            texts.append(f"`{c.name}` {'<=>' if v is None else '='} {show_row(v, 40)}")
        cond = parts[0]
        for p in parts[1:]:
            cond = cond & p
        self.counts["filters"] += 1
        try:
            got = Counter(canon_rows(df.filter(cond).toArrow()))
            want = Counter(canon_rows(self.model_frame(model).filter(cond).toArrow()))
        except Exception as exc:  # noqa: BLE001
            self._report(Discrepancy("unexpected_error", self.step_no, name, list(self.history[name]),
                                     reader=f"{reader} WHERE {' AND '.join(texts)}", expected="the model's rows",
                                     got=first_line(exc)))
            return
        if self.verbose:
            self.log(f"    {reader} WHERE {' AND '.join(texts)}: {sum(got.values())} rows")
        if got != want:
            self._report(Discrepancy("wrong_filter", self.step_no, name, list(self.history[name]),
                                     reader=f"{reader} WHERE {' AND '.join(texts)}",
                                     expected=f"{sum(want.values())} rows", got=f"{sum(got.values())} rows",
                                     rows=_diff(want, got)))


def _diff(want: Counter, have: Counter, limit: int = 3) -> list[str]:
    missing = list((want - have).items())[:limit]
    extra = list((have - want).items())[:limit]
    return ([f"missing x{n}: {show_row(r)}" for r, n in missing] + [f"unexpected x{n}: {show_row(r)}" for r, n in extra])
