"""PyTorch training on an exchange: an ``IterableDataset`` whose (rank, DataLoader worker) pairs each
read their own rows, with equal steps on every DDP rank and exact mid-epoch resumes.

torch is optional: ``import sparkflow_exchange`` never imports it, this module does.

Each reader (``rank x workers + worker``) reads its share of the exchange straight from the service
(the same gates, credit and checks as a Spark read task): a slow rank holds back only the producers of
its own subpartitions (``PIPELINED_BOUNDED``) or no one (``HYBRID``, whose writers spill). Epochs after
the first re-read the committed exchange (``HYBRID`` or ``BLOCKING``) with the subpartitions in a new
order drawn from ``(seed, epoch)``. Who reads what and how many batches each rank makes is in
``training_plan.py``.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import client
from . import exchange as ex
from .arrow_numpy import fixed_values, indices, unpack_bits, validity
from .description import ExchangeDescription
from .errors import ConfigError, ExchangeError, ExchangeNotFound
from .kinds import ExchangeState
from .training_plan import (
    Balance,
    EpochPlan,
    Segment,
    delivered,
    even_segments,
    plan_epoch,
    subpartition_order,
    whole_subpartitions,
)

__all__ = ["ExchangeDataset", "ExchangeLoader", "to_tensors"]

Transform = Callable[[pa.RecordBatch], Any]


def to_tensors(batch: pa.RecordBatch) -> dict[str, torch.Tensor]:
    """A batch as ``{column: tensor}``: numeric and boolean columns, fixed-size lists as 2-D tensors.

    The tensors share the batch's memory, which Arrow never writes again: a model reads its inputs, and
    a DataLoader worker copies them into shared memory anyway. Write into them only after ``.clone()``."""
    with warnings.catch_warnings():  # torch warns that the memory is read-only: it is, and stays so
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return {name: _tensor(name, column) for name, column in zip(batch.schema.names, batch.columns)}


def _tensor(name: str, column: pa.Array) -> torch.Tensor:
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        return _tensor(name, column.flatten()).reshape(len(column), width)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)):
        raise ConfigError(f"column {name!r} of type {column.type} has no tensor: choose numeric columns "
                          "(columns=[...]) or pass a transform that builds the batch")
    if column.null_count and not pa.types.is_floating(column.type):
        raise ConfigError(f"column {name!r} has nulls, which a {column.type} tensor cannot hold: fill them in "
                          "the writing job or pass a transform")
    return torch.from_numpy(_numpy(column))


def _numpy(column: pa.Array) -> np.ndarray:
    """A numeric or boolean column as NumPy, read from its Arrow buffers: no copy for numbers without nulls
    (``Array.to_numpy`` imports pandas on its first call, half a second in every fresh DataLoader worker)."""
    if pa.types.is_boolean(column.type):
        values = unpack_bits(column.buffers()[1], column.offset, len(column)).view(np.bool_)
    else:
        values = fixed_values(column, column.type.to_pandas_dtype())
    valid = validity(column)
    if valid is not None:  # floating point only (checked by the caller): a null is NaN
        values = np.where(valid, values, np.nan).astype(values.dtype)
    return values


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class ExchangeDataset(IterableDataset):
    """An exchange as batches for a training loop (the dataset makes the batches: DataLoader batch_size=None).

    ``batch_size``: rows per batch (``even`` may make some a row or more smaller so every reader makes
    the same number). ``columns``: what to read. ``transform``: ``RecordBatch -> batch`` (default:
    :func:`to_tensors`). ``balance``: ``even`` (every row once; starts when the exchange is committed),
    ``drop`` or ``pad`` (``pad`` starts while the exchange is still written), see ``training_plan.py``.
    ``seed``/``shuffle``: the subpartition order of each epoch. ``rank``/``world_size``: default
    torch.distributed's, else ``RANK``/``WORLD_SIZE``, else 0/1 (taken when the dataset is made: DataLoader
    workers have no process group). ``settings``: as for ``open_reader``.
    """

    def __init__(self, exchange: str, batch_size: int, *, columns: Sequence[str] | None = None,
                 transform: Transform | None = None, balance: str | Balance = Balance.EVEN, seed: int = 0,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None,
                 **settings: Any) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        found_rank, found_world = _distributed()
        self.rank = found_rank if rank is None else rank
        self.world_size = found_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.exchange = exchange
        self.batch_size = batch_size
        self.columns = list(columns) if columns is not None else None
        self.transform = transform or to_tensors
        self.balance = Balance.parse(balance)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.settings = settings
        client.exchange_config(exchange, **settings)  # bad settings fail here, not in a worker
        self.epoch = 0
        self.steps = 0  # steps delivered this epoch (counted by ExchangeLoader, or by __iter__ without one)
        self._resume = 0  # steps of this epoch to skip on the next iteration (load_state_dict)
        self._write_epoch: int | None = None  # the exchange's write this state belongs to
        self._live_epoch = False  # this epoch began while the exchange was written (pad): read in arrival order
        self._counting = True

    # ------------------------------------------------------------ epochs and state
    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (a new subpartition order)."""
        self.epoch, self.steps, self._resume, self._live_epoch = int(epoch), 0, 0, False

    def state_dict(self) -> dict:
        """Where this rank is: the epoch and the steps delivered in it (the same on every rank after a step)."""
        return {"exchange": self.exchange, "write_epoch": self._write_epoch, "epoch": self.epoch,
                "steps": self.steps, "live": self._live_epoch, "seed": self.seed, "shuffle": self.shuffle,
                "balance": self.balance.value,
                "batch_size": self.batch_size, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        """Resume where ``state`` was taken: the next iteration skips the steps already delivered."""
        for key in ("exchange", "seed", "shuffle", "balance", "batch_size", "world_size"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ConfigError(f"the state was taken with {key}={state.get(key)!r}, this dataset has {mine!r}: "
                                  "a resume must read the same exchange the same way")
        if state.get("live") and int(state["steps"]):
            raise ConfigError(
                f"the state was taken at step {state['steps']} of epoch {state['epoch']}, which began while exchange "
                f"{self.exchange!r} was still written (balance='pad'): its rows came in arrival order, which no later "
                "read repeats, so a resume could lose or repeat rows. Resume from the start of that epoch "
                "(set_epoch) or of the next one; epochs that begin after the commit resume exactly")
        self.epoch, self.steps, self._resume = int(state["epoch"]), int(state["steps"]), int(state["steps"])
        self._write_epoch = state.get("write_epoch")

    # ------------------------------------------------------------ planning
    def _config(self):
        return client.exchange_config(self.exchange, **self.settings)

    def plan(self, desc: ExchangeDescription | None = None, workers: int = 1) -> EpochPlan:
        """This epoch's batches for every reader (needs the committed counts)."""
        desc = desc if desc is not None else ex.describe_exchange(self._config())
        counts = _counts(desc)
        order = subpartition_order(len(counts), self.seed, self.epoch, self.shuffle)
        return plan_epoch(counts, order, self.world_size, workers, self.batch_size, self.balance)

    def steps_per_rank(self, workers: int = 1) -> int:
        """The number of steps every rank makes this epoch (waits for the write to commit)."""
        desc = _committed(self._config(), self.exchange)
        return self.plan(desc, workers).steps

    # ------------------------------------------------------------ reading
    def __iter__(self) -> Iterator[Any]:
        """This reader's batches of the epoch (planned now: a DataLoader calls this in each worker)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        reader = self.rank * workers + worker
        readers = self.world_size * workers
        config = self._config()
        desc = ex.describe_exchange(config)
        self._check_write(desc)
        live = not desc.sealed
        if live and (self.balance is not Balance.PAD or self._resume):
            desc = _committed(config, self.exchange)  # even/drop need the counts; a resume needs their order
            live = False
        if info is None:
            self._live_epoch = live
        if live:
            batches = self._live(config, desc, reader, readers, worker, workers)
        else:
            plan = self.plan(desc, workers)
            mine = plan.reader_batches(reader)
            skip = self._skipped(plan, worker, workers)
            batches = self._planned(config, desc, plan, reader, readers, mine, skip)
        self._resume = 0
        return self._delivered(batches, self._counting and info is None)

    def _delivered(self, batches: Iterator[Any], count: bool) -> Iterator[Any]:
        for batch in batches:
            if count:
                self.steps += 1
            yield batch if isinstance(batch, dict) else self.transform(batch)  # dicts: made tensors already

    def _check_write(self, desc: ExchangeDescription) -> None:
        if self._write_epoch is not None and self._resume and desc.epoch != self._write_epoch:
            raise ExchangeError(f"exchange {self.exchange!r} was written again since the state was taken "
                                f"(write {self._write_epoch}, now {desc.epoch}): a resume cannot continue it")
        self._write_epoch = desc.epoch

    def _skipped(self, plan: EpochPlan, worker: int, workers: int) -> int:
        """Batches this worker delivered before the resume point."""
        if not self._resume:
            return 0
        first = self.rank * workers
        if self._resume > plan.steps:
            raise ConfigError(f"the state is at step {self._resume} of epoch {self.epoch}, which has {plan.steps} steps")
        return delivered([len(plan.sizes[first + w]) for w in range(workers)], self._resume)[worker]

    def _planned(self, config, desc: ExchangeDescription, plan: EpochPlan, reader: int, readers: int, sizes: list[int],
                 skip: int) -> Iterator[pa.RecordBatch]:
        counts = _counts(desc)
        order = subpartition_order(len(counts), self.seed, self.epoch, self.shuffle)
        if self.balance is Balance.EVEN:
            segments = even_segments(order, counts, readers, reader)
        else:
            segments = [Segment(s, 0, int(counts[s])) for s in whole_subpartitions(order, readers, reader)]
        pads = plan.pads[reader]
        real = sizes[:len(sizes) - pads]
        skip_rows = sum(real[:skip])
        rows = _rows(config, desc, segments, skip_rows, self.columns)
        exact = self.balance is not Balance.DROP
        try:  # drop: the reader stops at its last planned batch, its other rows are not read
            if self.transform is to_tensors and (self.columns is None or self.columns):
                yield from _cut(_buffer_tensors(rows), real[skip:], exact=exact, rows=_TensorRows)
            else:
                yield from _cut(rows, real[skip:], exact=exact)
        finally:
            rows.close()
        pads_done = max(0, skip - len(real))
        if pads > pads_done:
            source = _pad_source(config, desc, segments, order, counts, self.batch_size, self.columns)
            for _ in range(pads - pads_done):
                yield source

    def _live(self, config, desc: ExchangeDescription, reader: int, readers: int, worker: int,
              workers: int) -> Iterator[pa.RecordBatch]:
        """pad on an exchange still written: whole subpartitions as they arrive, then the pads the counts ask for."""
        n = desc.num_subpartitions
        order = subpartition_order(n, self.seed, self.epoch, self.shuffle)
        subs = whole_subpartitions(order, readers, reader)
        made = 0
        first: pa.RecordBatch | None = None
        if subs:
            stream = client._open(config, desc, subs, self.columns)
            for batch in _cut(iter(stream), None, self.batch_size):
                first = first if first is not None else batch
                made += 1
                yield batch
        desc = _committed(config, self.exchange)
        plan = self.plan(desc, workers)
        if len(plan.sizes[reader]) - plan.pads[reader] != made:
            raise ExchangeError(f"reader {reader} of exchange {self.exchange!r} made {made} batches, the committed "
                                f"counts give it {len(plan.sizes[reader]) - plan.pads[reader]}")
        if plan.pads[reader]:
            counts = _counts(desc)
            source = _repeat(first, self.batch_size) if first is not None else _pad_source(
                config, desc, [], order, counts, self.batch_size, self.columns)
            for _ in range(plan.pads[reader]):
                yield source

    def loader(self, num_workers: int = 0, **kwargs: Any) -> "ExchangeLoader":
        """A DataLoader over this dataset that counts the steps it delivers (for ``state_dict``)."""
        return ExchangeLoader(self, num_workers=num_workers, **kwargs)


class ExchangeLoader(DataLoader):
    """A DataLoader of an :class:`ExchangeDataset`: batches from the dataset (batch_size=None), workers in
    order and not persistent (each epoch's workers get the dataset's epoch and resume point), started by
    fork where there is one, steps counted, the next epoch begun when one ran to its end."""

    def __init__(self, dataset: ExchangeDataset, num_workers: int = 0, **kwargs: Any) -> None:
        for key, value in (("batch_size", None), ("in_order", True), ("persistent_workers", False)):
            if key in kwargs and kwargs[key] != value:
                raise ConfigError(f"ExchangeLoader needs {key}={value!r}: the dataset makes the batches, hands them "
                                  "out in worker order and learns each epoch's resume point at its start")
            kwargs[key] = value
        if num_workers and kwargs.get("multiprocessing_context") is None and "fork" in mp.get_all_start_methods():
            # workers start anew every epoch: by fork in milliseconds, by spawn (the default inside ranks that
            # torch.multiprocessing.spawn started) each imports torch again
            kwargs["multiprocessing_context"] = "fork"
        if dataset.transform is to_tensors and kwargs.get("collate_fn") is None:
            kwargs["collate_fn"] = _as_made  # the batches are tensors already: nothing to convert
        super().__init__(dataset, num_workers=num_workers, **kwargs)
        dataset._counting = False

    def __iter__(self) -> Iterator[Any]:
        ds: ExchangeDataset = self.dataset  # type: ignore[assignment]
        if ds.balance is Balance.PAD and not ds._resume:  # the workers may begin while the exchange is written
            ds._live_epoch = _maybe_live(ds._config())
        batches = super().__iter__()  # workers start now, each with the dataset's epoch and resume point
        ds._resume = 0
        for batch in batches:
            ds.steps += 1
            yield batch
        ds.set_epoch(ds.epoch + 1)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]


def _as_made(batch: Any) -> Any:
    """The collate function of batches that are tensors already (DataLoader's default would walk each batch
    looking for NumPy arrays to convert: a tenth of an in-process epoch)."""
    return batch


def _maybe_live(config) -> bool:
    """Whether an epoch starting now may read the exchange while it is written, asked without waiting: only an
    exchange committed already is not. Asked before the workers start (so what they see is never "more live"
    than this), and without waiting for a declaration, so they start at once and wait for it themselves."""
    try:
        return not ex.describe_exchange(config, wait=False).sealed
    except ExchangeNotFound:
        return True


# ------------------------------------------------------------------ rows
def _committed(config, name: str) -> ExchangeDescription:
    """The description once the write committed (waits up to readerTimeout)."""
    import time

    deadline = time.monotonic() + config.reader_timeout
    while True:
        desc = ex.describe_exchange(config)
        if desc.sealed:
            return desc
        if desc.state is ExchangeState.ABORTED:
            raise ExchangeError(f"the write of exchange {name!r} was aborted: {desc.abort_reason or 'a task failed'}")
        if time.monotonic() > deadline:
            raise ExchangeError(f"exchange {name!r} was not committed within readerTimeout={config.reader_timeout:g} s")
        time.sleep(0.2)


def _counts(desc: ExchangeDescription) -> np.ndarray:
    rows = desc.subpartition_rows
    if rows is None:
        raise ConfigError(f"exchange {desc.name!r} has no rows per subpartition ("
                          f"{'not committed yet' if not desc.sealed else 'a forward or broadcast write'}): "
                          "training plans need a committed hash, rebalance, rescale or custom exchange")
    return np.asarray(rows, dtype=np.int64)


def _rows(config, desc: ExchangeDescription, segments: list[Segment], skip: int,
          columns: Sequence[str] | None) -> Iterator[pa.RecordBatch]:
    """The segments' rows in a fixed order (``exchange.read_in_commit_order``): two readers sharing a
    subpartition, and a resume, see the same rows at the same offsets."""
    for seg in segments:
        if skip >= seg.rows:
            skip -= seg.rows
            continue
        start, stop = seg.start + skip, seg.stop
        skip = 0
        at = 0
        batches = ex.read_in_commit_order(config, desc, seg.subpartition)
        try:
            for batch in batches:
                n = batch.num_rows
                lo, hi = max(start - at, 0), min(stop - at, n)
                at += n
                if hi > lo:
                    batch = batch.slice(lo, hi - lo) if (lo, hi) != (0, n) else batch
                    yield batch.select(columns) if columns is not None else batch
                if at >= stop:
                    break
        finally:
            batches.close()


class _ArrowRows:
    """How :func:`_cut` measures, slices and joins Arrow record batches."""

    @staticmethod
    def length(batch: pa.RecordBatch) -> int:
        return batch.num_rows

    @staticmethod
    def slice(batch: pa.RecordBatch, start: int, stop: int | None = None) -> pa.RecordBatch:
        return batch.slice(start, None if stop is None else stop - start)

    @staticmethod
    def join(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
        return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class _TensorRows:
    """The same for batches already made tensors (``{column: tensor}``): a slice is a view of the tensor."""

    @staticmethod
    def length(batch: dict) -> int:
        return len(next(iter(batch.values())))

    @staticmethod
    def slice(batch: dict, start: int, stop: int | None = None) -> dict:
        return {name: t[start:stop] for name, t in batch.items()}

    @staticmethod
    def join(batches: list[dict]) -> dict:
        return {name: torch.cat([b[name] for b in batches]) for name in batches[0]}


def _cut(batches: Iterator[Any], sizes: list[int] | None, size: int | None = None,
         exact: bool = True, rows: type = _ArrowRows) -> Iterator[Any]:
    """Batches of exactly ``sizes`` rows (or of ``size``, the last one what is left); ``exact``: the rows
    must be all used (the committed counts planned them), else the rest is left unread. ``rows``: the kind
    of batch (Arrow record batches, or tensor dicts)."""
    pending: list = []  # batches not cut yet, the first one from row ``at`` on
    at = held = 0
    wanted = iter(sizes) if sizes is not None else None
    want = next(wanted, None) if wanted is not None else size
    for batch in batches:
        n = rows.length(batch)
        if not n:
            continue
        pending.append(batch)
        held += n
        while want is not None and held >= want:
            first = rows.length(pending[0]) - at
            if first >= want:  # the usual case: a slice of one decoded buffer, no copy
                yield rows.slice(pending[0], at, at + want)
                at += want
                if first == want:
                    pending.pop(0)
                    at = 0
            else:
                joined = rows.join([rows.slice(pending[0], at)] + pending[1:])
                yield rows.slice(joined, 0, want)
                pending, at = ([joined], want) if held > want else ([], 0)
            held -= want
            want = next(wanted, None) if wanted is not None else size
            if want is None and not exact:
                return
    if wanted is not None:
        if want is not None or held:
            raise ExchangeError(f"read {held} rows more or fewer than the committed counts planned")
    elif held:
        rest = [rows.slice(pending[0], at)] + pending[1:]
        yield rows.join(rest) if len(rest) > 1 else rest[0]


def _buffer_tensors(batches: Iterator[pa.RecordBatch]) -> Iterator[dict]:
    """Each decoded buffer made tensors once (:func:`to_tensors`): the loop's batches are then views of them, and
    a DataLoader worker hands over one shared storage per buffer and column, not one per batch."""
    for batch in batches:
        if batch.num_rows:
            yield to_tensors(batch)


def _repeat(rows: pa.RecordBatch, size: int) -> pa.RecordBatch:
    """``size`` rows taken round and round from ``rows`` (a pad batch)."""
    take = indices(np.arange(size) % rows.num_rows)
    return rows.take(take)


def _pad_source(config, desc: ExchangeDescription, segments: list[Segment], order: np.ndarray, counts: np.ndarray,
                size: int, columns: Sequence[str] | None) -> pa.RecordBatch:
    """The rows a pad batch repeats: the reader's first rows, else the epoch's first rows."""
    if not any(s.rows for s in segments):
        first = next((int(s) for s in order if counts[s]), None)
        if first is None:
            raise ExchangeError("the exchange has no rows to pad a rank's batches with")
        segments = [Segment(first, 0, int(counts[first]))]
    got = next(_cut(_rows(config, desc, segments, 0, columns), None, size))
    return _repeat(got, size)
