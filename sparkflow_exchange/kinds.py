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


PARTITION_TYPES = tuple(t.value for t in PartitionType)
RE_READABLE = frozenset(t for t in PartitionType if t.re_readable)  # holds the plain strings too (a StrEnum's hash)
