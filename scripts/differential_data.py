"""Random schemas, rows and layouts for the differential tester (``differential.py``), and the canonical form
of a row that reads are compared in.

Everything here is plain Python and pyarrow (no Spark): a schema is a list of ``Column`` (a name, a Spark type
in DDL, the Arrow type every writer declares for it, and a value generator); rows are built as an Arrow table,
from which the Spark writers' DataFrames and ``open_writer``'s batches are both made, so every writer writes the
same values.
"""
from __future__ import annotations

import datetime as dt
import math
import random
import struct
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Callable

import pyarrow as pa

UTC = dt.timezone.utc

STRINGS = ["", "a", "A", "abc", "ABC", "Abc", "é", "É", "ß", "SS", "日本語", "😀", "a b", " a", "a\u0000b", "ǅ", "İ", "i",
           "x" * 40, "ü", "ü"]
BINARIES = [b"", b"\x00", b"\x00\x00", b"\xff", b"\xff\x00\x01", b"abc", bytes(range(20))]
DOUBLES = [0.0, -0.0, 1.0, -1.5, 2.25, math.nan, math.inf, -math.inf, 1e308, -1e-308, 5e-324, 3.141592653589793]
FLOATS = [0.0, -0.0, 1.0, -1.5, 2.25, math.nan, math.inf, -math.inf, 3.4028234663852886e38, 1.401298464324817e-45]
DATES = [dt.date(1970, 1, 1), dt.date(1969, 12, 31), dt.date(1900, 1, 1), dt.date(2024, 2, 29), dt.date(9999, 12, 31),
         dt.date(1, 1, 1), dt.date(2000, 6, 15)]
NAIVE = [dt.datetime(1970, 1, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999), dt.datetime(2024, 2, 29, 12, 30, 1, 5),
         dt.datetime(1900, 1, 1, 0, 0, 0, 1), dt.datetime(2038, 1, 19, 3, 14, 8), dt.datetime(2021, 3, 28, 2, 30)]
DECIMALS = [Decimal("0.000"), Decimal("-0.001"), Decimal("1.100"), Decimal("123456789.123"), Decimal("-999999999.999"),
            Decimal("42.000"), Decimal("0.500")]


@dataclass(frozen=True)
class ColType:
    """One column type: its Spark DDL, its Arrow type, whether Spark hashes it (a key), and a value generator."""
    name: str
    ddl: str
    arrow: pa.DataType
    gen: Callable[[random.Random], Any]
    hashable: bool = True


def _ints(bits: int) -> Callable[[random.Random], int]:
    edges = [0, 1, -1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))]

    def gen(r: random.Random) -> int:
        return r.choice(edges) if r.random() < 0.15 else r.randint(-6, 25)  # few distinct keys: keys collide
    return gen


def _array(r: random.Random) -> list:
    return [None if r.random() < 0.2 else r.randint(-3, 3) for _ in range(r.randint(0, 3))]


def _map(r: random.Random) -> list:
    keys = r.sample(STRINGS[:10], r.randint(0, 3))
    return [(k, None if r.random() < 0.3 else r.randint(-5, 5)) for k in keys]


def _struct(r: random.Random) -> dict:
    return {"a": None if r.random() < 0.2 else r.randint(-3, 3),
            "s": None if r.random() < 0.2 else r.choice(STRINGS),
            "d": None if r.random() < 0.2 else [r.choice(DOUBLES) for _ in range(r.randint(0, 2))]}


TYPES: list[ColType] = [
    ColType("int", "INT", pa.int32(), _ints(32)),
    ColType("long", "BIGINT", pa.int64(), _ints(64)),
    ColType("short", "SMALLINT", pa.int16(), _ints(16)),
    ColType("boolean", "BOOLEAN", pa.bool_(), lambda r: r.random() < 0.5),
    ColType("string", "STRING", pa.string(), lambda r: r.choice(STRINGS)),
    ColType("binary", "BINARY", pa.binary(), lambda r: r.choice(BINARIES)),
    ColType("decimal", "DECIMAL(12,3)", pa.decimal128(12, 3), lambda r: r.choice(DECIMALS)),
    ColType("double", "DOUBLE", pa.float64(), lambda r: r.choice(DOUBLES)),
    ColType("float", "FLOAT", pa.float32(), lambda r: r.choice(FLOATS)),
    ColType("date", "DATE", pa.date32(), lambda r: r.choice(DATES)),
    ColType("timestamp", "TIMESTAMP", pa.timestamp("us", tz="UTC"), lambda r: r.choice(NAIVE).replace(tzinfo=UTC)),
    ColType("timestamp_ntz", "TIMESTAMP_NTZ", pa.timestamp("us"), lambda r: r.choice(NAIVE)),
    ColType("array", "ARRAY<INT>", pa.list_(pa.int32()), _array),
    ColType("map", "MAP<STRING, BIGINT>", pa.map_(pa.string(), pa.int64()), _map, hashable=False),
    ColType("struct", "STRUCT<a: INT, s: STRING, d: ARRAY<DOUBLE>>",
            pa.struct([("a", pa.int32()), ("s", pa.string()), ("d", pa.list_(pa.float64()))]), _struct),
]
BY_NAME = {t.name: t for t in TYPES}
COLLATED = ColType("string_lcase", "STRING COLLATE UTF8_LCASE", pa.string(), lambda r: r.choice(STRINGS))
# key types whose equality filters are pruned on (docs/batch-guide.md), and the others a filter is checked on
FILTER_TYPES = {"int", "long", "short", "string", "binary", "decimal", "date", "timestamp", "timestamp_ntz", "double",
                "boolean", "string_lcase"}


@dataclass(frozen=True)
class Column:
    name: str
    type: ColType
    null_rate: float = 0.1

    @property
    def ddl(self) -> str:
        return f"`{self.name}` {self.type.ddl}"


@dataclass(frozen=True)
class Layout:
    """What an exchange is declared with: an append must bring exactly this."""
    partitioner: str  # hash | broadcast | forward | rebalance
    keys: tuple[str, ...]
    n: int
    columns: tuple[Column, ...]
    partition_type: str = "HYBRID"

    @property
    def ddl(self) -> str:
        return ", ".join(c.ddl for c in self.columns)

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type.arrow) for c in self.columns])

    @property
    def collated(self) -> bool:
        return any(c.type is COLLATED for c in self.columns)

    def describe(self) -> str:
        keys = f"({', '.join(self.keys)})" if self.keys else ""
        cols = ", ".join(f"{c.name} {c.type.ddl}" for c in self.columns) or "no columns"
        return f"{self.partitioner}{keys} x{self.n} {self.partition_type} [{cols}]"


@dataclass
class Features:
    """Generators that can be switched off (``--disable``): each one exercises paths that have given wrong
    answers before, so each can be named on its own."""
    other_layout_append: bool = True   # appends with other keys, key order, partitioner, width or schema
    case_collision: bool = True        # columns `k` and `K` (spark.sql.caseSensitive=true), keys and filters on them
    failing_overwrite: bool = True     # overwrites whose tasks fail (bufferSize=1g through the jar)
    zero_columns: bool = True          # DataFrames with rows and no columns
    collation: bool = True             # STRING COLLATE UTF8_LCASE columns and keys
    broadcast_catalog: bool = True     # broadcast exchanges read through the catalog (readPartitions=auto)
    failing_replace_catalog: bool = True  # failing overwrites through the catalog's createOrReplace

    NAMES = ("other_layout_append", "case_collision", "failing_overwrite", "zero_columns", "collation",
             "broadcast_catalog", "failing_replace_catalog")

    @classmethod
    def without(cls, disabled: list[str]) -> "Features":
        unknown = [d for d in disabled if d not in cls.NAMES]
        if unknown:
            raise SystemExit(f"unknown generator {unknown[0]!r}; known: {', '.join(cls.NAMES)}")
        return cls(**{d: False for d in disabled})


def random_columns(r: random.Random, features: Features) -> tuple[Column, ...]:
    """1-6 columns of random types, at least one hashable; sometimes `k` and `K` together; sometimes none at all."""
    if features.zero_columns and r.random() < 0.1:
        return ()
    types = list(TYPES) + ([COLLATED, COLLATED] if features.collation else [])
    count = r.randint(1, 6)
    names = [f"c{i}" for i in range(count)]
    if features.case_collision and r.random() < 0.4:
        names[:2] = ["k", "K"] if count >= 2 else ["K"]
        if count < 2:
            names.append("k")
    cols = []
    for name in names:
        t = r.choice(types)
        cols.append(Column(name, t, null_rate=r.choice([0.0, 0.05, 0.3])))
    named = {c.name: i for i, c in enumerate(cols)}
    if "k" in named and "K" in named and r.random() < 0.85:  # one type: a literal for `k` is also one for `K`
        cols[named["K"]] = replace(cols[named["K"]], type=cols[named["k"]].type)
    if not any(c.type.hashable for c in cols):
        cols[0] = replace(cols[0], type=BY_NAME["int"])
    r.shuffle(cols)
    return tuple(cols)


def random_layout(r: random.Random, features: Features, columns: tuple[Column, ...] | None = None) -> Layout:
    columns = random_columns(r, features) if columns is None else columns
    hashable = [c.name for c in columns if c.type.hashable]
    choices = ["hash"] * 5 + ["broadcast", "rebalance", "forward"] if hashable else ["broadcast", "rebalance", "forward"]
    partitioner = r.choice(choices)
    keys: tuple[str, ...] = ()
    if partitioner == "hash":
        keys = tuple(r.sample(hashable, r.randint(1, min(3, len(hashable)))))
        if {"k", "K"} <= set(hashable) and r.random() < 0.5:  # hashed on one of two names that differ in case
            keys = (r.choice(["k", "K"]),)
    n = r.choice([1, 2, 3, 4, 4, 8]) if partitioner != "forward" else r.choice([1, 2, 3])
    ptype = r.choice(["HYBRID", "HYBRID", "BLOCKING"])
    return Layout(partitioner, keys, n, columns, ptype)


def other_layouts(r: random.Random, layout: Layout) -> list[tuple[str, Layout]]:
    """Layouts an append must be refused with: each differs from ``layout`` in one thing."""
    out: list[tuple[str, Layout]] = []
    hashable = [c.name for c in layout.columns if c.type.hashable]
    if layout.partitioner == "hash":
        others = [c for c in hashable if c not in layout.keys]
        if others:
            out.append(("other keys", replace(layout, keys=(r.choice(others),))))
        if len(layout.keys) >= 2:
            out.append(("keys reordered", replace(layout, keys=tuple(reversed(layout.keys)))))
        out.append(("other partitioner", replace(layout, partitioner="rebalance", keys=())))
    elif hashable:
        out.append(("other partitioner", replace(layout, partitioner="hash", keys=(r.choice(hashable),))))
    if layout.partitioner != "forward":
        out.append(("other width", replace(layout, n=layout.n * 2 if layout.n < 8 else layout.n - 1)))
    if layout.columns:
        extra = Column("extra_col", BY_NAME["int"])
        out.append(("extra column", replace(layout, columns=layout.columns + (extra,))))
    return out


def random_rows(r: random.Random, layout: Layout, count: int) -> pa.Table:
    """``count`` rows of ``layout``'s columns as an Arrow table (a table of no columns keeps its row count)."""
    if not layout.columns:
        return pa.table({"_": pa.array(range(count), pa.int64())}).drop(["_"])
    arrays = []
    for col in layout.columns:
        values = [None if r.random() < col.null_rate else col.type.gen(r) for _ in range(count)]
        arrays.append(pa.array(values, type=col.type.arrow))
    return pa.Table.from_arrays(arrays, schema=layout.arrow_schema)


# ------------------------------------------------------------------ canonical rows
def canon(value: Any) -> Any:
    """A hashable value equal for equal data: floats by their bits (every NaN one value, -0.0 not 0.0), maps as
    sorted pairs, structs and lists as tuples, timestamps as microseconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("f", struct.pack(">d", value))
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, dict):
        return ("struct",) + tuple(canon(v) for v in value.values())
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):  # a map's pairs
            return ("map",) + tuple(sorted(((canon(k), canon(v)) for k, v in value), key=repr))
        return ("list",) + tuple(canon(v) for v in value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            delta = value.astimezone(UTC) - dt.datetime(1970, 1, 1, tzinfo=UTC)
            return ("ts", delta // dt.timedelta(microseconds=1))
        return ("ntz", (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1))
    if isinstance(value, Decimal):
        return ("dec", str(value))
    return value


def canon_rows(table: pa.Table, columns: list[str] | None = None, pid: str | None = None) -> list[tuple]:
    """Each row of ``table`` (its columns by position, or ``columns`` by name), canonical; with ``pid`` the row is
    ``(partition, row)``."""
    names = list(table.column_names)
    idx = [i for i, n in enumerate(names) if n != pid] if columns is None else [names.index(c) for c in columns]
    cols = [[canon(v) for v in table.column(i).to_pylist()] for i in idx]
    rows = list(zip(*cols)) if cols else [()] * table.num_rows
    if pid is None:
        return rows
    pids = table.column(names.index(pid)).to_pylist()
    return list(zip(pids, rows))


def show_row(row: Any, width: int = 160) -> str:
    text = repr(row)
    return text if len(text) <= width else text[:width] + "..."


@dataclass
class ExchangeModel:
    """The committed state of one exchange: its layout and the rows of every committed write."""
    layout: Layout
    tables: list[pa.Table] = field(default_factory=list)
    history: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables)
