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


FLAG_COMPRESSED = 1
FLAG_SHARED = 2  # a BufferResponse whose payload is a SharedRef: the buffer is in a writer's arena
BROADCAST = -1  # subpartition index of a buffer meant for every subpartition
# an END_OF_PARTITION's payload: the data buffers and rows its subpartition (or range) holds; rows -1 = not known
END_COUNTS = struct.Struct(">qq")
