"""Partition types: what a result partition promises its readers (Flink's ResultPartitionType).

A string enum: values travel as they are in options, JSON and status, and compare equal to their
names, so a type read from the wire or a setting is one ``PartitionType(value)`` away. Every room
imports it from here (standard library only).
"""
from __future__ import annotations

import enum


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
