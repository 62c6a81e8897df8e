"""Partition types: what a result partition promises its readers (Flink's ResultPartitionType).

A string enum: values travel as they are in options, JSON and status, and compare equal to their
names, so a type read from the wire or a setting is one ``PartitionType(value)`` away. Every room
imports it from here (standard library only).
"""
from __future__ import annotations

import enum

from . import contract


class PartitionType(enum.StrEnum):
    HYBRID = "HYBRID"  # streamed while written, and written through to disk: re-readable, never blocks the writer
    BLOCKING = "BLOCKING"  # written to disk, readable once finished: re-readable
    PIPELINED_BOUNDED = "PIPELINED_BOUNDED"  # streamed once through a bounded pool: the writer waits for readers

    @property
    def re_readable(self) -> bool:
        """A reader may read it again, from any position (a reconnect resumes, a stream's epoch is re-read)."""
        return self is not PartitionType.PIPELINED_BOUNDED

    @property
    def consume_once(self) -> bool:
        """Each buffer is read once and freed (the pool bounds the writer)."""
        return self is PartitionType.PIPELINED_BOUNDED

    @classmethod
    def names(cls) -> str:
        return ", ".join(t.value for t in cls)


class Partitioner(enum.StrEnum):
    """How a writer routes rows to subpartitions (Flink's partitioners); a value is the ``partitioner`` option's.

    Its properties are the contract's (``contract.json`` ``partitioners``), which the JVM plugin reads too."""

    HASH = "hash"  # by the keys' Spark hash: Spark's own placement
    BROADCAST = "broadcast"  # every row to every reader
    FORWARD = "forward"  # producer i to reader i
    REBALANCE = "rebalance"  # round robin over all subpartitions
    RESCALE = "rescale"  # round robin over this producer's share of the subpartitions
    CUSTOM = "custom"  # a module:function of the user's

    @classmethod
    def of(cls, value: object) -> Partitioner:
        """The partitioner an option names (any case); a ValueError naming the known ones otherwise."""
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(f"unknown partitioner {value!r}; use one of {cls.names()}") from None

    @classmethod
    def names(cls) -> str:
        """The partitioners' names, for a message that lists them."""
        return ", ".join(p.value for p in cls)

    @property
    def keyed(self) -> bool:
        """Needs the ``keys`` option."""
        return bool(contract.load()["partitioners"][self.value]["keyed"])

    @property
    def single_subpartition(self) -> bool:
        """Each producer writes one subpartition of its own (forward) or one every reader reads (broadcast):
        a reader reads whole producers, never a range of subpartitions, and the width is not the write's."""
        return bool(contract.load()["partitioners"][self.value]["single_subpartition"])


class PartitionState(enum.StrEnum):
    """A producer's partition, as the service and the coordinator report it."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class ExchangeState(enum.StrEnum):
    """An exchange, as the coordinator reports it to readers and in its list."""

    OPEN = "open"  # a write is running
    COMMITTED = "committed"
    ABORTED = "aborted"
    DROPPED = "dropped"  # its name was dropped (a notification; the exchange is gone)
    LOST = "lost"  # the coordinator's connection went (a notification a reader's client makes itself)
    STREAMING = "streaming"  # a stream's description


class ServiceState(enum.StrEnum):
    """An exchange service, as the coordinator's registry knows it."""

    ALIVE = "alive"  # registered, its heartbeats arrive
    LOST = "lost"  # silent for heartbeatTimeout, or replaced by a new process at its address


class ExchangeKind(enum.StrEnum):
    """What wrote an exchange: a batch job (one dataset) or a streaming query (a sequence of epochs)."""

    BATCH = "batch"
    STREAM = "stream"


class ChannelState(enum.StrEnum):
    """One input channel of a reading task."""

    PENDING = "pending"  # waiting for its connection (or a reconnect)
    REQUESTED = "requested"  # its partition request is out: buffers flow
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (ChannelState.FINISHED, ChannelState.FAILED, ChannelState.CANCELLED)

    @property
    def live(self) -> bool:
        return self in (ChannelState.PENDING, ChannelState.REQUESTED)


PARTITION_TYPES = tuple(t.value for t in PartitionType)
RE_READABLE = frozenset(t for t in PartitionType if t.re_readable)  # holds the plain strings too (a StrEnum's hash)
