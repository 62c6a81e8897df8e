"""The exchange lifecycle as clients see it: declare, produce, read, drop (commit and abort: ``write_handle``).

Everything the Spark glue needs, usable without Spark (the service tests use
it directly). Each function takes the one :class:`ExchangeConfig`.
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Iterable, Iterator

import pyarrow as pa

from .buffer import schema_to_b64
from .calls import call, describe, require_name
from .config import ConfigError, ExchangeConfig
from .consumer.input_gate import InputGate
from .description import ExchangeDescription
from .errors import ErrorCode, ExchangeError, ExchangeNotFound, ServiceError, error_for
from .kinds import Partitioner, PartitionType
from .network.blocking_client import REPLICA_UNACKED_MS, WRITER_CONNECTIONS, detect_dead_peer
from .service.discovery import Endpoints, coordinators, no_service_message, resolve
from .write_handle import WriteHandle
from .writer.partition_writer import PartitionWriter, ReplicatedWriter
from .writer.record_writer import RecordWriter
from .writer.selectors import SelectorError, make_selector

log = logging.getLogger(__name__)

DEFAULT_SHUFFLE_PARTITIONS = 200  # Spark's spark.sql.shuffle.partitions default: the width when none is given


def _endpoints(config: ExchangeConfig) -> Endpoints:
    return resolve(config)


def validate_write(config: ExchangeConfig, schema: pa.Schema) -> Partitioner:
    """Fail at planning time on what every task would fail on; returns the write's partitioner."""
    try:
        partitioner = Partitioner.of(config.partitioner)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if partitioner is Partitioner.BROADCAST and config.partition_type == PartitionType.PIPELINED_BOUNDED and config.num_subpartitions is None:
        raise ConfigError(
            "broadcast with partitionType PIPELINED_BOUNDED needs numSubpartitions: each reader consumes its own copy "
            "of every buffer once, so the number of readers must be known when writing")
    if partitioner.single_subpartition:
        return partitioner
    # without numSubpartitions each task takes the session's spark.sql.shuffle.partitions (checked as it registers)
    try:
        make_selector(partitioner, config.num_subpartitions or DEFAULT_SHUFFLE_PARTITIONS, 0, schema,
                      keys=config.keys,
                      num_producers=config.num_producers, custom=config.custom)
    except SelectorError as exc:
        raise ConfigError(str(exc)) from None
    return partitioner


def declare_write(config: ExchangeConfig, schema: pa.Schema, overwrite: bool) -> WriteHandle:
    name = require_name(config)
    partitioner = validate_write(config, schema)
    reply = call(config, "declare", name=name, schema=schema_to_b64(schema),
                 num_subpartitions=config.num_subpartitions,
                 partitioner={"name": partitioner.value, "keys": list(config.keys), "custom": config.custom,
                              # one subpartition read by every consumer (a broadcast of unknown width)
                              "shared": partitioner is Partitioner.BROADCAST and config.num_subpartitions is None},
                 partition_type=config.partition_type, mode="overwrite" if overwrite else "append",
                 coalesce=config.num_subpartitions is None and not partitioner.single_subpartition,
                 **({"replicas": config.replicas} if config.replicas else {}),
                 **({"readers": list(config.readers)} if config.readers else {}))
    desc = ExchangeDescription.parse(reply)  # the declared exchange, and this write's id
    return WriteHandle(config, name, desc.epoch, reply["write_id"], desc.schema, desc.num_subpartitions, partitioner,
                       desc.readers if desc.private else None)


class ProducerTask:
    """One task attempt's result partition: register, write batches, finish (or fail).

    ``num_subpartitions``: the width to write when the exchange's was not given (the Spark glue passes the
    task's spark.sql.shuffle.partitions; default 200); the coordinator refuses a width other than the first's.
    """

    def __init__(self, handle: WriteHandle, index: int, attempt: str, num_subpartitions: int | None = None) -> None:
        self.handle = handle
        config = handle.config
        self.config = config
        self.index = index
        self.endpoints = _endpoints(config)
        n = handle.num_subpartitions
        width = None
        if handle.width_open:
            n = width = num_subpartitions or DEFAULT_SHUFFLE_PARTITIONS
        single = handle.partitioner.single_subpartition
        if handle.partitioner is Partitioner.FORWARD and n is not None and index >= n:
            raise ExchangeError(
                f"forward needs equal parallelism: producer {index} has no subpartition among numSubpartitions={n}; "
                "repartition the DataFrame to that many partitions or drop the numSubpartitions option")
        self.partition = f"{handle.name}.{handle.epoch}.{index}.{attempt}.{uuid.uuid4().hex[:8]}"
        # a connection of an earlier task of this worker when there is one (Spark reuses its Python workers)
        service = self.endpoints.service
        self.conn = WRITER_CONNECTIONS.take((service, self.endpoints.secret, self.endpoints.host_id),
                                            lambda: self.endpoints.connect(service, config))
        self.finished = False
        num_subs = n if handle.partitioner is Partitioner.BROADCAST and n is not None else 1 if single else n
        try:
            self._join(attempt, num_subs, width)
        except BaseException:  # whatever failed, the connection's state is unknown: it is not pooled
            self.conn.close()
            raise

    def _join(self, attempt: str, num_subs: int | None, width: int | None) -> None:
        """Register the partition with the service and the producer with the coordinator."""
        handle, config = self.handle, self.config
        if self.conn.location is None:
            self.conn.location = self.conn.call("ping")
        self.location = self.conn.location
        self.writer = PartitionWriter(self.conn, self.partition, num_subs, config.partition_type,
                                      exchange=handle.name, attempt=attempt,
                                      no_consumer_timeout=config.no_consumer_timeout,
                                      buffer_size=config.buffer_size, buffers=config.buffers_per_partition,
                                      shared_memory=config.shared_memory)
        if handle.private_readers is not None:  # before it joins: no reader learns of it before its service knows
            self.conn.call("set_partition_readers", partition=self.partition, readers=list(handle.private_readers))
        extra = {} if width is None else {"num_subpartitions": width}
        try:
            joined = self._coordinator_call("register_producer", name=handle.name, epoch=handle.epoch,
                                            write_id=handle.write_id, index=self.index, attempt=attempt,
                                            partition=self.partition, location=self.location, **extra)
        except ExchangeError:  # refused (another width, a closed write): the partition never joined, free it
            try:
                self.conn.call("release_partitions", partitions=[self.partition])
            except ServiceError:
                pass
            raise
        replicas = joined.get("replicas") if isinstance(joined, dict) else None
        if replicas:
            self.writer = self._replicated(attempt, num_subs, replicas)
        self.records = RecordWriter(self.writer, handle.schema, handle.partitioner, num_subs or 1, self.index,
                                    keys=config.keys, buffer_size=config.buffer_size,
                                    buffer_timeout=config.buffer_timeout, compression=config.compression,
                                    sort_buffer_size=config.sort_buffer_size,
                                    num_producers=config.num_producers, custom=config.custom)

    def _replicated(self, attempt: str, num_subs: int | None, replicas: list[dict]) -> ReplicatedWriter:
        """The same partition registered with each replica's service (another host's, chosen by the
        coordinator), written over TCP beside the partition's own."""
        config = self.config
        writers: list[tuple[PartitionWriter, dict]] = []
        try:
            for where in replicas:
                try:
                    conn = self.endpoints.connect(where["tcp"], config)
                    detect_dead_peer(conn.sock, REPLICA_UNACKED_MS)  # a vanished host fails the write, not a hang
                    writers.append((PartitionWriter(conn, self.partition, num_subs, config.partition_type,
                                                    exchange=self.handle.name, attempt=attempt,
                                                    no_consumer_timeout=config.no_consumer_timeout,
                                                    buffer_size=config.buffer_size,
                                                    buffers=config.buffers_per_partition, shared_memory=False),
                                    where))
                except ServiceError as exc:
                    raise error_for(ErrorCode.REPLICA_LOST, f"the replica of partition {self.partition} could not "
                                    f"be placed on exchange service {where.get('service_id')} (host "
                                    f"{where.get('host_id')}, {where.get('tcp')}): {exc}") from exc
        except BaseException:
            for writer, _ in writers:
                writer.conn.close()
            raise
        return ReplicatedWriter(self.writer, writers)

    def _coordinator_call(self, method: str, **args: Any) -> Any:
        if self.endpoints.coordinator == self.endpoints.service:
            return self.conn.call(method, **args)
        return call(self.config, method, **args)

    def write(self, batches: Iterable[pa.RecordBatch]) -> None:
        self.records.write_all(batches)

    def finish(self, marker: bytes | None = None) -> dict:
        """``marker``: a MARKER event to every subpartition after the data (a stream's epoch marker)."""
        stats = self.records.close(marker)  # DataLost when buffers were lost on the way (the message names what)
        self.finished = True  # the service has let go of the partition's handle on this connection
        replicas = []
        if isinstance(self.writer, ReplicatedWriter):  # each confirmed every buffer (close waited for it)
            replicas = [where["service_id"] for _, where in self.writer.replicas]
            self.writer.close_replicas()
        if self.writer.backpressure_seconds:
            self.conn.call("report_backpressure", partition=self.partition, seconds=self.writer.backpressure_seconds)
        self._coordinator_call("producer_finished", name=self.handle.name, epoch=self.handle.epoch,
                               partition=self.partition, spill=stats.get("spill_path", ""),
                               subpartition_bytes=stats.get("subpartition_bytes"),
                               subpartition_rows=self.records.sent_rows.tolist(),
                               rows=int(self.records.sent_rows.sum()), bytes=int(stats.get("bytes", 0)),
                               raw_bytes=int(stats.get("raw_bytes", stats.get("bytes", 0))),
                               **({"subpartition_raw_bytes": self.records.sent_raw_bytes.tolist()}
                                  if self.records.encoder.compression else {}),
                               **({"replicas": replicas} if replicas else {}))
        WRITER_CONNECTIONS.give(self.conn)  # clean: kept for this worker's next task
        return {"partition": self.partition, "index": self.index, "rows": self.records.rows,
                "bytes": stats.get("bytes", 0)}

    def fail(self, reason: str) -> None:
        try:
            if not self.finished:
                self.records.abort(reason)
            self._coordinator_call("producer_failed", name=self.handle.name, epoch=self.handle.epoch,
                                   partition=self.partition, reason=reason)
        except ExchangeError:
            pass
        finally:
            self.conn.close()
            if isinstance(getattr(self, "writer", None), ReplicatedWriter):
                self.writer.close_replicas()


def describe_exchange(config: ExchangeConfig, *, wait: bool = True, allow_stream: bool = False) -> ExchangeDescription:
    """The exchange (schema, numSubpartitions...), waiting up to declareTimeout for it to be declared.
    ``allow_stream``: a stream's description is an answer too."""
    return describe(config, wait=wait, allow_stream=allow_stream)


def read_subpartition(config: ExchangeConfig, desc: ExchangeDescription, index: int, end: int | None = None,
                      marker: bytes | None = None,
                      producers: tuple[int, int] | None = None, stride: int | None = None) -> Iterator[pa.RecordBatch]:
    """Subpartition ``index`` (or ``index..end-1``) of every producer. A description of a sealed exchange is
    a read plan: its committed producers are read without asking the coordinator again.

    ``producers``: only the committed producers [first, last) in commit order (a split of a skewed
    subpartition; the description must be sealed). ``stride``: subpartitions index, index + stride, ... below
    ``end`` (or the width), all at once in arrival order (a read laid out to the task slots)."""
    n = desc.num_subpartitions
    if stride is not None and stride < 1:
        raise ExchangeError(f"bad stride {stride} reading exchange {desc.name!r} (needs 1 or more)")
    if end is not None and (end <= index or index < 0 or (n is not None and end > n)):
        raise ExchangeError(f"bad subpartition range [{index}, {end}) of exchange {desc.name!r} with "
                            f"{n} subpartitions (needs 0 <= start < end <= {n})")
    plan = desc.sealed_producers()
    if producers is not None:
        first, last = producers
        if plan is None or not 0 <= first < last <= len(plan):
            raise ExchangeError(
                f"bad producer range [{first}, {last}) of exchange {desc.name!r}: "
                + ("a range of producers is read from a sealed exchange's plan only" if plan is None else
                   f"it has {len(plan)} committed producers (needs 0 <= first < last <= {len(plan)})"))
        plan = plan[first:last]
    ep = _endpoints(config)
    gate = InputGate(config, desc, index, ep.coordinator, ep.secret, ep.host_id, local_service=ep.service,
                     subpartition_end=end, producers=plan, marker=marker, stride=stride)
    return iter(gate)


def drop_exchange(name: str, config: ExchangeConfig | None = None, *, jvm: int | None = None) -> dict:
    """Drop ``name`` at the coordinator that holds it (:func:`discovery.coordinators`; ``jvm``: the
    driver JVM whose plugin coordinator to ask). Starts no service: with none running there is nothing
    to drop, and ExchangeNotFound says so."""
    config = (config or ExchangeConfig.load()).replace(exchange=name)
    found = coordinators(config, jvm=jvm)
    if not found:
        raise ExchangeNotFound(f"exchange {name!r} was not dropped: " + no_service_message("nothing to drop"))
    missing = None
    for ep in found:
        try:
            with ep.connect(ep.coordinator, config) as conn:
                return conn.call("drop", name=name)
        except ExchangeNotFound as exc:
            missing = exc
    where = ", ".join(ep.coordinator for ep in found)
    raise ExchangeNotFound(str(missing) if len(found) == 1 else f"exchange {name!r} does not exist (asked {where})")


def list_exchanges(config: ExchangeConfig | None = None, *, jvm: int | None = None) -> list[dict]:
    """The exchanges of every coordinator :func:`discovery.coordinators` finds; [] when none runs (none is started)."""
    config = config or ExchangeConfig.load()
    out: list[dict] = []
    for ep in coordinators(config, jvm=jvm):
        try:
            with ep.connect(ep.coordinator, config) as conn:
                out.extend(conn.call("list_exchanges"))
        except ServiceError as exc:
            raise error_for(exc.code, f"listing the exchanges of {ep.coordinator}: {exc}") from None
    return out


def attempt_id(partition_id: int, attempt_number: int, task_attempt_id: int) -> str:
    """A task attempt's name: Spark's partition, attempt number and unique task attempt id."""
    return f"{partition_id}-{attempt_number}-{task_attempt_id}"


def read_in_commit_order(config: ExchangeConfig, desc: ExchangeDescription, index: int,
                         end: int | None = None) -> Iterator[pa.RecordBatch]:
    """Subpartitions [index, end) of a sealed exchange in a fixed order: producer after producer in commit
    order, each producer's buffers in sequence. Two reads see the same rows at the same offsets (a split
    of one subpartition between readers, a resume that skips what was delivered).

    One gate when every producer is a spill file on this host (that path reads in commit order); else one
    gate per producer, since channels deliver in arrival order."""
    plan = desc.sealed_producers()
    if plan is None:
        raise ExchangeError(f"exchange {desc.name!r} is not committed: its order is not fixed yet")
    ep = _endpoints(config)
    probe = InputGate(config, desc, index, ep.coordinator, ep.secret, ep.host_id, local_service=ep.service,
                      subpartition_end=end, producers=plan)
    if probe._local_files() is not None:
        yield from probe
        return
    for p in range(len(plan)):
        yield from read_subpartition(config, desc, index, end, producers=(p, p + 1))
