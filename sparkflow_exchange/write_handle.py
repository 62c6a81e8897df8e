"""A batch write as its driver side sees it: the handle every task gets, and its commit or abort.

Light at import (no pyarrow, no data path; tasks import those where they write): Spark unpickles the
writer, and with it this handle, in a fresh planning worker to commit a write, so what this module
imports is paid by every write's commit. Declaring and producing live in :mod:`sparkflow_exchange.exchange`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .calls import call
from .config import ExchangeConfig
from .errors import ExchangeError
from .kinds import Partitioner

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class WriteHandle:
    """What the driver's writer hands to every task (pickled) and gets back at commit."""

    config: ExchangeConfig
    name: str
    epoch: int
    write_id: str
    schema_b64: str
    num_subpartitions: int | None
    partitioner: Partitioner
    # the exchange's readers when they are not every credential: each task names them to its service
    private_readers: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self.partitioner = Partitioner.of(self.partitioner)

    @property
    def width_open(self) -> bool:
        """The width was not given: each task brings its session's spark.sql.shuffle.partitions."""
        return self.num_subpartitions is None and not self.partitioner.single_subpartition

    @property
    def schema(self) -> pa.Schema:
        from .buffer import schema_from_b64

        return schema_from_b64(self.schema_b64)


def commit_write(handle: WriteHandle, partitions: list[str], rows: dict[str, int] | None = None) -> dict:
    """Seal the write; ``rows`` (rows each partition's task wrote) are checked against what its producer pushed."""
    extra = {} if rows is None else {"rows": rows}
    return call(handle.config, "commit", name=handle.name, epoch=handle.epoch, write_id=handle.write_id,
                partitions=partitions, **extra)


def abort_write(handle: WriteHandle, reason: str = "") -> None:
    try:
        call(handle.config, "abort", name=handle.name, epoch=handle.epoch, write_id=handle.write_id, reason=reason)
    except ExchangeError:
        pass
