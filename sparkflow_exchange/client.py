"""Reading and writing exchanges from any Python program, without Spark.

``open_reader`` and ``open_writer`` are what a Spark read or write task does, minus Spark: the same
declare / produce / commit lifecycle (``exchange.py``), record writer and selectors (so hash placement
is Spark's), input gates under credit with their checksums and end-of-partition counts, settings
(``config.py``: spark-defaults.conf, ``SPARKFLOW_EXCHANGE_CONF``, then the call's own settings) and
service discovery (a configured coordinator, the plugin's file, else the embedded service). An
exchange written here is read by ``spark.read.format("pipelined")`` and the reverse.
"""
from __future__ import annotations

import queue
import threading
import uuid
from typing import Any, Callable, Iterable, Iterator, Sequence

import pyarrow as pa

from . import exchange as ex
from . import write_handle as wh
from .config import ConfigError, ExchangeConfig
from .description import ExchangeDescription
from .errors import ExchangeError, SchemaMismatch
from .kinds import ExchangeState, Partitioner

__all__ = ["open_reader", "open_writer", "ExchangeWriter", "exchange_config", "read_plan"]

_FIELD_TO_KEY = {}  # declare_timeout -> declareTimeout: settings are accepted in either spelling


def _field_keys() -> dict[str, str]:
    if not _FIELD_TO_KEY:
        from .config import _KEYS

        _FIELD_TO_KEY.update({name: key for key, (name, _, _) in _KEYS.items()})
    return _FIELD_TO_KEY


def exchange_config(exchange: str, **settings: Any) -> ExchangeConfig:
    """The one config object for a client call: defaults < spark-defaults.conf < ``SPARKFLOW_EXCHANGE_CONF``
    < ``settings`` (public keys such as ``declareTimeout``, or their field names such as ``declare_timeout``)."""
    if not isinstance(exchange, str) or not exchange:
        raise ConfigError(f"exchange must be a non-empty name, got {exchange!r}")
    fields = _field_keys()
    options: dict[str, Any] = {}
    for key, value in settings.items():
        if value is None:
            continue
        options[fields.get(key, key)] = value
    options["exchange"] = exchange
    return ExchangeConfig.load(options)


# ------------------------------------------------------------------ reading
def _selection(subpartitions: int | Iterable[int] | None, width: int, partitioner: Partitioner, name: str) -> list[int]:
    """The subpartitions to read, checked against the exchange's width (bad ones named)."""
    if subpartitions is None:
        # a broadcast exchange holds one copy per consumer: "every row once" is one consumer's copy
        return [0] if partitioner is Partitioner.BROADCAST else list(range(width))
    if isinstance(subpartitions, bool) or not isinstance(subpartitions, (int, Iterable)):
        raise ConfigError(f"subpartitions must be an int, a sequence of ints or None, got {subpartitions!r}")
    chosen = [subpartitions] if isinstance(subpartitions, int) else list(subpartitions)
    bad = [s for s in chosen if isinstance(s, bool) or not isinstance(s, int)]
    if bad:
        raise ConfigError(f"subpartitions must be ints, got {bad[:5]!r}")
    outside = [s for s in chosen if not 0 <= s < width]
    if outside:
        raise ConfigError(f"subpartitions {outside[:5]} are outside exchange {name!r}, which has {width} "
                          f"subpartitions (0 to {width - 1})")
    if len(set(chosen)) != len(chosen):
        twice = sorted({s for s in chosen if chosen.count(s) > 1})
        raise ConfigError(f"subpartitions {twice[:5]} are named more than once: each would be read twice")
    return chosen


def _projection(schema: pa.Schema, columns: Sequence[str] | None, name: str) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise ConfigError(f"columns must be a sequence of column names, got {columns!r}")
    columns = list(columns)
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise ConfigError(f"exchange {name!r} has no column {missing[0]!r}; its columns: {', '.join(schema.names)}")
    if len(set(columns)) != len(columns):
        raise ConfigError(f"columns named more than once: {columns!r}")
    return columns


def _runs(chosen: list[int]) -> list[tuple[int, int]]:
    """Ascending neighbours joined into [start, end) ranges (one gate, one channel per producer each)."""
    runs: list[tuple[int, int]] = []
    for s in chosen:
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], s + 1)
        else:
            runs.append((s, s + 1))
    return runs


def read_plan(exchange: str, **settings: Any) -> ExchangeDescription:
    """The exchange's description as a reader sees it now (waits up to declareTimeout for it to be
    declared and to know its width): ``num_subpartitions``, ``sealed``, ``subpartition_rows`` (rows per
    subpartition once committed), ``arrow_schema``..."""
    return ex.describe_exchange(exchange_config(exchange, **settings))


def open_reader(exchange: str, subpartitions: int | Iterable[int] | None = None,
                columns: Sequence[str] | None = None, **settings: Any) -> pa.RecordBatchReader:
    """A ``pyarrow.RecordBatchReader`` of the given subpartitions of every producer of ``exchange``.

    Works while the exchange is still written (each subpartition's buffers arrive under credit as the
    producers flush them; the reader ends when the write commits) or after. ``subpartitions``: one index,
    several, or None for all (a broadcast exchange: one copy). ``columns``: only these, in this order
    (DuckDB and Polars push no projection into a reader, so choose here). ``settings``: any setting of
    ``config.py`` (``coordinator``, ``secret``, ``declareTimeout``, ``readerTimeout``...). The reader is
    also an Arrow C stream (``__arrow_c_stream__``); close it (or use ``with``) to stop early.
    """
    config = exchange_config(exchange, **settings)
    return _open(config, ex.describe_exchange(config), subpartitions, columns)


def _open(config: ExchangeConfig, desc: ExchangeDescription, subpartitions: int | Iterable[int] | None,
          columns: Sequence[str] | None) -> pa.RecordBatchReader:
    name = desc.name
    schema = desc.arrow_schema
    partitioner = desc.partitioner.name
    chosen = _selection(subpartitions, desc.num_subpartitions, partitioner, name)
    projected = _projection(schema, columns, name)
    out_schema = pa.schema([schema.field(c) for c in projected], metadata=schema.metadata) if projected else schema
    if desc.sealed and not partitioner.single_subpartition:
        parts = [(lambda s=s, e=e: ex.read_subpartition(config, desc, s, e if e > s + 1 else None))
                 for s, e in _runs(chosen)]
    else:
        parts = [(lambda s=s: ex.read_subpartition(config, desc, s)) for s in chosen]
    # a bounded writer blocks on any subpartition nobody reads: read them all at once; a HYBRID writer never
    # blocks (what waits spills) and BLOCKING is read once finished, so one after another costs nothing
    at_once = not desc.sealed and len(parts) > 1 and desc.partition_type.consume_once
    batches = _merged(parts) if at_once else _sequential(parts)
    if projected is not None:
        batches = (b.select(projected) for b in batches)
    return pa.RecordBatchReader.from_batches(out_schema, batches)


def _sequential(parts: list[Callable[[], Iterator[pa.RecordBatch]]]) -> Iterator[pa.RecordBatch]:
    """Each range read in turn."""
    for part in parts:
        yield from part()


_END = object()


def _merged(parts: list[Callable[[], Iterator[pa.RecordBatch]]]) -> Iterator[pa.RecordBatch]:
    """A PIPELINED_BOUNDED exchange still written: every subpartition read at once, in arrival order.

    One gate per subpartition on a thread of its own, all into one bounded queue: a full queue stops a
    gate taking buffers, so its credit stops and its producers wait (PIPELINED_BOUNDED) or spill (HYBRID).
    Reading them one after another would leave a bounded writer blocked on a subpartition nobody reads.
    """
    out: queue.Queue = queue.Queue(maxsize=2 * len(parts))
    stop = threading.Event()

    def pump(part: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        batches = None
        try:
            batches = part()
            for batch in batches:
                if not _put(out, batch, stop):
                    return
            _put(out, _END, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            _put(out, exc, stop)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    threads = [threading.Thread(target=pump, args=(p,), daemon=True, name=f"sparkflow-reader-{i}")
               for i, p in enumerate(parts)]
    for t in threads:
        t.start()
    try:
        ended = 0
        while ended < len(threads):
            item = out.get()
            if item is _END:
                ended += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


# ------------------------------------------------------------------ writing
class ExchangeWriter:
    """One producer of an exchange, written from this process; commits on ``close()`` / a clean ``with``.

    ``write`` routes every row with the exchange's partitioner exactly as a Spark write task does; an
    exception inside ``with`` (or ``abort()``) releases everything written, and nothing is committed.
    """

    def __init__(self, config: ExchangeConfig, schema: pa.Schema, overwrite: bool) -> None:
        if not isinstance(schema, pa.Schema):
            raise ConfigError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        self.schema = schema
        self.handle = ex.declare_write(config, schema, overwrite)
        self.name = self.handle.name
        self.rows = 0
        self.state = ExchangeState.OPEN
        try:
            self._producer = ex.ProducerTask(self.handle, 0, ex.attempt_id(0, 0, uuid.uuid4().int >> 80))
        except BaseException as exc:
            wh.abort_write(self.handle, f"the writer could not start: {exc}")
            raise

    def write(self, data: pa.RecordBatch | pa.Table) -> None:
        """Route ``data``'s rows to their subpartitions (a Table is written batch by batch)."""
        if self.state != ExchangeState.OPEN:
            raise ExchangeError(f"the writer of exchange {self.name!r} is {self.state}: nothing more can be written")
        if not isinstance(data, (pa.RecordBatch, pa.Table)):
            raise ConfigError(f"write takes a pyarrow.RecordBatch or Table, got {type(data).__name__}")
        if not data.schema.equals(self.schema):
            raise SchemaMismatch(f"batch schema does not match exchange {self.name!r}: batch has {_fields(data.schema)}, "
                                 f"the writer was opened with {_fields(self.schema)}")
        batches = data.to_batches() if isinstance(data, pa.Table) else [data]
        try:
            self._producer.write(batches)
        except BaseException as exc:
            self.abort(f"{type(exc).__name__}: {exc}")
            raise
        self.rows += data.num_rows

    def commit(self) -> dict:
        """Finish the producer and commit the write: readers see every row from now on, Spark reads included."""
        if self.state != ExchangeState.OPEN:
            raise ExchangeError(f"the writer of exchange {self.name!r} is {self.state}: it cannot commit")
        try:
            result = self._producer.finish()
            desc = wh.commit_write(self.handle, [result["partition"]], {result["partition"]: result["rows"]})
        except BaseException as exc:
            self.abort(f"the commit failed: {type(exc).__name__}: {exc}")
            raise
        self.state = ExchangeState.COMMITTED
        return desc

    def abort(self, reason: str = "aborted by the writer") -> None:
        """Release everything written; readers of this write fail with ``reason``."""
        if self.state != ExchangeState.OPEN:
            return
        self.state = ExchangeState.ABORTED
        self._producer.fail(reason)
        wh.abort_write(self.handle, reason)

    def __enter__(self) -> "ExchangeWriter":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.abort(f"{exc_type.__name__}: {exc}")
        elif self.state == ExchangeState.OPEN:
            self.commit()


def _fields(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name} {f.type}" for f in schema) + ")"


def open_writer(exchange: str, schema: pa.Schema, partitioner: Partitioner | str = Partitioner.HASH, keys: Sequence[str] = (),
                num_subpartitions: int | None = None, mode: str = "overwrite", **settings: Any) -> ExchangeWriter:
    """A context manager that writes ``exchange`` as one producer and commits when the block ends.

    ``partitioner``/``keys``/``num_subpartitions`` are the write options Spark takes (hash placement is
    Spark's ``repartition(n, *keys)``: ``spark_partition_id()`` of a Spark read equals the subpartition);
    without ``num_subpartitions`` a hash exchange has Spark's default width, 200, and Spark reads it
    coalesced. ``mode``: ``overwrite`` (a new epoch) or ``append`` (another write to the current one).
    ``settings``: any setting of ``config.py`` (``partitionType``, ``bufferSize``, ``coordinator``...).
    """
    if mode not in ("overwrite", "append"):
        raise ConfigError(f"unknown mode {mode!r}; use overwrite or append")
    if isinstance(keys, str):
        keys = [keys]
    try:
        kind = Partitioner.of(partitioner)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if kind.keyed and not keys:
        raise ConfigError(f"a {kind} exchange needs keys: open_writer(..., keys=['column', ...])")
    missing = [k for k in keys if isinstance(schema, pa.Schema) and schema.get_field_index(k) < 0]
    if missing:
        raise ConfigError(f"key {missing[0]!r} is not a column of the schema; its columns: {', '.join(schema.names)}")
    config = exchange_config(exchange, partitioner=kind.value, keys=",".join(keys) if keys else None,
                             numSubpartitions=num_subpartitions, **settings)
    return ExchangeWriter(config, schema, overwrite=mode == "overwrite")
