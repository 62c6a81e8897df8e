"""What a buffer is, as every room names it: its kinds, flags, the broadcast target and the end counts.

Kept apart from ``buffer.py`` (which encodes with pyarrow) so the exchange service, which never
decodes a batch, does not load pyarrow: that alone is about 40 MiB of its resident memory.
"""
from __future__ import annotations

import enum
import struct


class BufferKind(enum.IntEnum):
    """Data needs credit; events (end of partition, markers) do not."""

    DATA = 0
    END_OF_PARTITION = 1
    MARKER = 2


FLAG_COMPRESSED = 1  # a message of the buffer may be compressed (each says so; the service reads the sizes of flagged ones)
FLAG_SHARED = 2  # a BufferResponse whose payload is a SharedRef: the buffer is in a writer's arena
BROADCAST = -1  # subpartition index of a buffer meant for every subpartition
# an END_OF_PARTITION's payload: the data buffers and rows its subpartition (or range) holds; rows -1 = not known
END_COUNTS = struct.Struct(">qq")
# a stream's epoch marker (Flink's checkpoint barrier): a MARKER event every subpartition of an epoch's
# producer carries after its data and before its end of partition; the reader checks it names its epoch
EPOCH_MARKER = struct.Struct(">4sq")
_EPOCH_MAGIC = b"EPCH"


def epoch_marker(epoch: int) -> bytes:
    return EPOCH_MARKER.pack(_EPOCH_MAGIC, epoch)


def marker_epoch(payload: bytes) -> int | None:
    """The epoch a marker names, or None when it is not an epoch marker."""
    if len(payload) != EPOCH_MARKER.size:
        return None
    magic, epoch = EPOCH_MARKER.unpack(payload)
    return epoch if magic == _EPOCH_MAGIC else None
