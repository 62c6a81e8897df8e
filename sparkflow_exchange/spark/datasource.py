"""The Spark glue: ``format("pipelined")`` as a Python data source. Thin by design.

Where each piece runs (PYSPARK-NOTES.md): ``schema``/``reader``/``writer``
in short-lived planning workers on the driver, ``read``/``write`` in executor
workers, ``commit``/``abort`` on the writer pickled at planning time. Settings
arrive as options, spark-defaults.conf, the session settings a ``register(spark)``
subclass carries (planning) and the task's local properties (tasks, TASK_KEYS only);
shared state lives in the service.

Expected failures (:class:`~sparkflow_exchange.errors.UserFacing`, a lost service)
leave each entry point through ``spark_errors.user_errors``: the user reads
``sparkflow_exchange.<Error>: <message>`` right after Spark's own line, no traceback.
The streaming sink lives in ``stream_sink.py`` (light: Spark imports it once per micro-batch).
Spark imports this module in every short-lived planning worker (lookup, write, commit, schema, read
plan), most of which never talk to the service: the client, Arrow and NumPy are imported where used.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..config import ConfigError, ExchangeConfig, read_spark_defaults
from ..consumer.read_plan import AUTO, requested_width
from ..description import ExchangeDescription
from ..errors import SchemaMismatch
from .spark_errors import guarded, user_errors

if TYPE_CHECKING:
    import pyarrow as pa

    from ..write_handle import WriteHandle
    from .stream_sink import PipelinedStreamWriter
    from .tasks import PartitionCommit


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class PipelinedDataSource(DataSource):
    """``spark.read/df.write.format("pipelined")``: Flink's data exchange between Spark jobs and applications."""

    # the session's spark.sparkflow.exchange.* settings, captured by register(spark) in a subclass
    session_conf: dict[str, str] = {}

    @classmethod
    def name(cls) -> str:
        return "pipelined"

    @user_errors
    def __init__(self, options: dict) -> None:
        super().__init__(options)
        self.config = ExchangeConfig.load(dict(options), session=self.session_conf)

    # schema() and reader() run in fresh planning workers: the light client and Arrow's IPC, not the data path
    @user_errors
    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        from ..calls import describe

        return from_arrow_schema(describe(self.config, allow_stream=True).arrow_schema)

    @user_errors
    def reader(self, schema: StructType) -> "PipelinedReader":
        from ..calls import describe

        desc = describe(self.config)
        _check_schema(self.config.exchange, _arrow_schema(schema), desc.arrow_schema)
        if self.config.split_skewed_subpartitions and self.config.read_partitions.strip().lower() != AUTO:
            raise ConfigError(
                f"splitSkewedSubpartitions and readPartitions={self.config.read_partitions} both lay out the read of "
                f"exchange {self.config.exchange!r}: give one of them")
        if self.config.split_skewed_subpartitions and not desc.coalesce:
            raise ConfigError(
                f"splitSkewedSubpartitions applies to exchanges written without numSubpartitions (coalesced "
                f"reads); exchange {self.config.exchange!r} was written with numSubpartitions="
                f"{desc.num_subpartitions} or a forward/broadcast partitioner, whose read partitions are "
                "exactly its subpartitions: drop the option, or write the exchange without numSubpartitions")
        requested_width(desc, self.config.read_partitions)  # a bad readPartitions fails here, naming what to give
        return PipelinedReader(self.config, _read_plan(desc), dict(self.options))

    @user_errors
    def writer(self, schema: StructType, overwrite: bool) -> "PipelinedWriter":
        if not schema.fields:  # Spark hands a Python writer such rows as batches of 0 rows: they would be lost
            raise ConfigError(
                f"exchange {self.config.exchange!r}: a DataFrame with no columns cannot be written by the Python data "
                "source (Spark passes it no rows); add a column, or write it through the plugin jar (catalog, or "
                "format(\"pipelined\") with the jar loaded), which keeps the row count")
        _refuse_collated(self.config, schema)
        finding = _ServiceLookup(self.config)  # a first write may start the embedded service meanwhile
        from .. import exchange as ex
        arrow_schema = _arrow_schema(schema)
        finding.result()
        handle = ex.declare_write(self.config, arrow_schema, overwrite)
        return PipelinedWriter(handle, dict(self.options))

    @user_errors
    def streamWriter(self, schema: StructType, overwrite: bool) -> "PipelinedStreamWriter":
        from . import streaming as st
        from .stream_sink import PipelinedStreamWriter

        config, options = st.live_flush(self.config, self.options)
        return PipelinedStreamWriter(st.declare_stream(config, _arrow_schema(schema)), options)

    @user_errors
    def streamReader(self, schema: StructType) -> "PipelinedStreamReader":
        from . import streaming as st
        desc = st.describe_stream(self.config)
        _check_schema(self.config.exchange, _arrow_schema(schema), desc.arrow_schema)
        return PipelinedStreamReader(self.config, desc.schema, dict(self.options))


class _ServiceLookup(threading.Thread):
    """Find (or start) the service in the background while the caller imports Arrow and the data path: a
    fresh application's first write pays the embedded service's start and those imports at once, not one
    after the other. ``result()`` waits for it and raises what the lookup raised."""

    def __init__(self, config: ExchangeConfig) -> None:
        super().__init__(name="sparkflow-find-service", daemon=True)
        self.config = config
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        from ..service.discovery import resolve

        try:
            resolve(self.config)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by result()
            self.error = exc

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def _refuse_collated(config: ExchangeConfig, schema: StructType) -> None:
    """A collated string anywhere in the rows (e.g. UTF8_LCASE) is refused: an exchange's schema is Arrow's, which
    keeps no collation, so its readers would place, compare, filter and join it as a plain string, unlike Spark."""
    from pyspark.sql.types import ArrayType, MapType, StringType

    def walk(dtype, where: str) -> None:
        if isinstance(dtype, StructType):
            for field in dtype.fields:
                walk(field.dataType, f"{where}.{field.name}" if where else field.name)
        elif isinstance(dtype, ArrayType):
            walk(dtype.elementType, f"{where}[]")
        elif isinstance(dtype, MapType):
            walk(dtype.keyType, f"{where}{{key}}")
            walk(dtype.valueType, f"{where}{{value}}")
        elif isinstance(dtype, StringType):
            collation = getattr(dtype, "collation", "UTF8_BINARY")
            if collation != "UTF8_BINARY":
                raise ConfigError(
                    f"column {where!r} of exchange {config.exchange!r} is a collated string ({collation}), whose "
                    "collation an exchange does not keep (its readers would compare it as a plain string): cast it "
                    f"to STRING, or write lower({where}) for UTF8_LCASE")

    walk(schema, "")


def _check_schema(name: str | None, given: pa.Schema, expected: pa.Schema) -> None:
    if not given.equals(expected):
        from ..spark_types import schema_text

        raise SchemaMismatch(f"the given schema does not match exchange {name!r}: given {schema_text(given)}, "
                             f"exchange has {schema_text(expected)}")


def _read_plan(desc: ExchangeDescription) -> ExchangeDescription:
    """What read tasks need of the description. Sealed: the committed producers (the read plan; the reader
    object travels once per stage in Spark's task binary, the InputPartitions per task, so the producers
    live here and a partition is just its range). Not sealed: no producers, the gate subscribes."""
    from ..consumer.read_plan import compact_producers

    producers = desc.sealed_producers()
    if producers is None:
        return desc.replace(producers=(), committed=())
    compact = tuple(compact_producers(producers))
    return desc.replace(producers=compact, committed=tuple(p["partition"] for p in compact))


DEFAULT_PARALLELISM = "spark.default.parallelism"


def task_slots(config: ExchangeConfig) -> int:
    """The reading application's task slots, as planning can learn them: ``taskSlots`` (register(spark) sets it
    to the session's defaultParallelism), else ``spark.default.parallelism`` of spark-defaults.conf, else the
    CPUs this planning worker may use (Spark's default parallelism of a local application on this host)."""
    if config.task_slots:
        return config.task_slots
    value = read_spark_defaults().get(DEFAULT_PARALLELISM, "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    import os

    return max(1, len(os.sched_getaffinity(0)))


@dataclass
class SubpartitionSplit(InputPartition):
    """Read subpartitions [index, end) of every producer (end None: just ``index``), or of the producers
    [first, last) in commit order (a split of a skewed subpartition); with ``stride``, subpartitions index,
    index + stride, ... below end, all at once (a read laid out to the task slots)."""

    index: int
    end: int | None = None
    producers: tuple[int, int] | None = None
    stride: int | None = None


class PipelinedReader(DataSourceReader):
    def __init__(self, config: ExchangeConfig, desc: ExchangeDescription, options: dict | None = None) -> None:
        self.config = config
        self.desc = desc
        self.options = options or {}  # the read's own options: they beat the task's session settings

    def partitions(self) -> list[SubpartitionSplit]:
        from ..consumer.read_plan import SkewRule, read_ranges

        config = self.config
        skew = SkewRule(config.skewed_partition_factor, config.skewed_partition_threshold) \
            if config.split_skewed_subpartitions else None
        slots = None if self.desc.sealed else task_slots(config)  # a read while written runs in as many tasks
        return [SubpartitionSplit(r.start, None if r.end == r.start + 1 else r.end, r.producers, r.stride)
                for r in read_ranges(self.desc, config.advisory_partition_size, skew, slots=slots,
                                     requested=config.read_partitions)]

    @user_errors
    def read(self, partition: SubpartitionSplit) -> Iterator[pa.RecordBatch]:
        from .. import exchange as ex
        from ..consumer.rebatch import rebatched
        from .tasks import task_session
        from .worker_heap import freezing_after

        config = self.config.for_task(self.options, task_session())
        batches = ex.read_subpartition(config, self.desc, partition.index, partition.end,
                                       producers=partition.producers, stride=partition.stride)
        # Spark pays per batch: small ones joined; and per task a full collection of the worker's heap
        return guarded(freezing_after(rebatched(batches, config.buffer_size), "read", config.freeze_worker_heap))


class PipelinedWriter(DataSourceArrowWriter):
    def __init__(self, handle: WriteHandle, options: dict | None = None) -> None:
        self.handle = handle
        self.options = options or {}  # the write's own options: they beat the task's session settings

    @user_errors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionCommit:
        from .tasks import write_task

        return write_task(self.handle, self.options, iterator)

    @user_errors
    def commit(self, messages: list[PartitionCommit | None]) -> None:
        from ..write_handle import commit_write  # light: Spark commits in a fresh planning worker
        done = [m for m in messages if m is not None]
        commit_write(self.handle, [m.partition for m in done], {m.partition: m.rows for m in done})

    def abort(self, messages: list[PartitionCommit | None]) -> None:
        from ..write_handle import abort_write
        abort_write(self.handle, "the Spark write job failed")


# ------------------------------------------------------------------ Structured Streaming (the sink: stream_sink.py)
@dataclass
class EpochSplit(InputPartition):
    """Subpartition ``index`` of every producer of the planned epochs, in epoch order."""

    index: int
    plans: list


class PipelinedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``readStream.format("pipelined")``: offsets are ``{"epochs": {exchange: last epoch read}, "group": g}``."""

    def __init__(self, config: ExchangeConfig, schema_b64: str, options: dict | None = None) -> None:
        self.config = config
        self.schema_b64 = schema_b64
        self.options = options or {}
        self.group = config.consumer_group
        self.upto: int | None = None  # availableNow: the newest epoch when the query started
        self.last_committed: int | None = None  # the stream's, as the last latestOffset saw it

    def _offset(self, epoch: int) -> dict:
        return {"epochs": {self.config.exchange: epoch}, "group": self.group}

    def _position(self, offset: dict) -> int:
        self.group = self.group or offset.get("group")
        try:
            return int(offset["epochs"][self.config.exchange])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"the query's checkpoint holds offset {offset!r}, not one of exchange "
                              f"{self.config.exchange!r}: was the checkpoint made by a query reading another "
                              "exchange?") from None

    @user_errors
    def initialOffset(self) -> dict:
        from . import streaming as st
        # Spark may ask twice (same reader): the second answer must name the same group, not a new one
        joined = st.join_group(self.config, self.group)
        self.group = joined["group"]
        return self._offset(joined["position"])

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_rows_per_trigger:
            return ReadMaxRows(self.config.max_rows_per_trigger)
        if self.config.max_bytes_per_trigger:
            return ReadMaxBytes(self.config.max_bytes_per_trigger)
        return ReadAllAvailable()

    @user_errors
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        from . import streaming as st
        after = self._position(start)
        # an idle trigger waits on the service for the next commit (availableNow: never, it stops at upto)
        found = st.latest_epoch(self.config, self.group, after, upto=self.upto,
                                max_rows=getattr(limit, "max_rows", None), max_bytes=getattr(limit, "max_bytes", None),
                                wait=self.config.stream_poll_wait if self.upto is None else 0.0)
        self.last_committed = found["last_committed"]
        return self._offset(found["epoch"])

    @user_errors
    def reportLatestOffset(self) -> dict | None:
        from . import streaming as st
        # Spark asks right after latestOffset, every trigger: its answer saves a second call to the service
        if self.last_committed is None:
            self.last_committed = st.describe_stream(self.config.replace(declare_timeout=0)).last_committed
        return self._offset(self.last_committed)

    @user_errors
    def prepareForTriggerAvailableNow(self) -> None:
        from . import streaming as st
        self.upto = st.describe_stream(self.config.replace(declare_timeout=0)).last_committed

    @user_errors
    def partitions(self, start: dict, end: dict) -> list[EpochSplit]:
        from ..consumer.read_plan import compact_producers
        from . import streaming as st

        plan = st.plan_epochs(self.config, self._position(start), self._position(end))
        if not plan["epochs"]:
            return []
        epochs = [{**e, "desc": e["desc"].replace(producers=tuple(compact_producers(list(e["desc"].producers))))}
                  for e in st.epoch_plans(plan)]
        return [EpochSplit(i, epochs) for i in range(plan["num_subpartitions"])]

    @user_errors
    def read(self, partition: EpochSplit) -> Iterator[pa.RecordBatch]:
        from ..buffer import schema_from_b64
        from ..consumer.rebatch import rebatched
        from . import streaming as st
        from .tasks import task_session
        from .worker_heap import freezing_after

        config = self.config.for_task(self.options, task_session())
        batches = st.read_epochs(config, schema_from_b64(self.schema_b64), partition.plans, partition.index)
        return guarded(freezing_after(rebatched(batches, config.buffer_size), "read", config.freeze_worker_heap))

    @user_errors
    def commit(self, end: dict) -> None:
        from . import streaming as st
        position = self._position(end)  # learns the group from the offset after a restart
        st.commit_group(self.config, self.group, position)
