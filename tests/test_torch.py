"""ExchangeDataset under DDP: 2 ranks (gloo, CPU, spawned) x 2 DataLoader workers, against a real service.

One spawned job runs every scenario in turn (starting ranks and importing torch is the expensive part):
a live epoch that starts before the writer commits, three exact epochs, a mid-epoch resume, and drop /
pad on a skewed exchange. Every step of every scenario does an all_reduce, so unequal steps would
fail the collective (timeout) rather than pass.
"""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch==2.13.0 (scripts/setup.sh)")

import sparkflow_exchange as sfe  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("k", pa.int64(), nullable=False),
                    pa.field("x", pa.float32(), nullable=False)])
RANKS, WORKERS, BATCH = 2, 2, 64
SKEWED_ROWS = 12_000
LIVE_FIRST, LIVE_ROWS = 4_000, 8_000


def _batch(ids: np.ndarray, skewed: bool) -> pa.RecordBatch:
    k = np.where(ids % 3 == 0, 0, ids) if skewed else ids  # a third of the rows in one subpartition
    return pa.record_batch([pa.array(ids), pa.array(k), pa.array(ids.astype(np.float32))], schema=SCHEMA)


def _ids(batches: list) -> np.ndarray:
    return np.concatenate([b["id"].numpy() for b in batches]) if batches else np.zeros(0, np.int64)


def _epoch(loader, marker: Path | None = None) -> tuple[np.ndarray, int]:
    import torch.distributed as dist

    got, steps = [], 0
    for batch in loader:
        if marker is not None and steps == 0:
            marker.write_text("first batch")
        got.append(batch)
        steps += 1
        dist.all_reduce(torch.ones(1))  # a rank with fewer steps would leave this one waiting: timeout
    return _ids(got), steps


def _rank_main(rank: int, work: str, settings: dict) -> None:
    import torch.distributed as dist

    from sparkflow_exchange.torch import ExchangeDataset

    work_dir = Path(work)
    dist.init_process_group("gloo", init_method=f"file://{work_dir / 'rendezvous'}", rank=rank,
                            world_size=RANKS, timeout=timedelta(seconds=120))
    out: dict = {}
    # 1. pad starts while the exchange is still written: the parent commits only after both first batches
    live = ExchangeDataset("t-live", BATCH, columns=["id"], balance="pad", seed=3, **settings)
    ids, steps = _epoch(live.loader(num_workers=WORKERS), work_dir / f"first-{rank}")
    out["live"] = {"ids": ids.tolist(), "steps": steps}
    # 2. three exact epochs of the skewed exchange, each in a new subpartition order
    ds = ExchangeDataset("t-skewed", BATCH, columns=["id", "x"], seed=7, **settings)
    loader = ds.loader(num_workers=WORKERS)
    for epoch in range(3):
        ids, steps = _epoch(loader)
        out[f"epoch{epoch}"] = {"ids": ids.tolist(), "steps": steps}
    # 3. epoch 3 stopped after 5 steps; a new dataset resumes from the state
    got = []
    for batch in loader:
        got.append(batch)
        dist.all_reduce(torch.ones(1))
        if len(got) == 5:
            break
    state = json.loads(json.dumps(loader.state_dict()))  # a state survives a checkpoint file
    again = ExchangeDataset("t-skewed", BATCH, columns=["id", "x"], seed=7, **settings)
    again.load_state_dict(state)
    rest, steps = _epoch(again.loader(num_workers=WORKERS))
    out["resume"] = {"before": _ids(got).tolist(), "after": rest.tolist(), "steps": 5 + steps,
                     "state": state}
    # 4. drop and pad on the skewed exchange
    for balance in ("drop", "pad"):
        other = ExchangeDataset("t-skewed", BATCH, columns=["id"], balance=balance, seed=7, **settings)
        planned = other.steps_per_rank(WORKERS)  # before the epoch: the loader moves on to the next at its end
        ids, steps = _epoch(other.loader(num_workers=WORKERS))
        out[balance] = {"ids": ids.tolist(), "steps": steps, "planned": planned}
    (work_dir / f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.fixture
def svc(tmp_service):
    return tmp_service()


def test_two_ranks_two_workers_read_exactly_once_resume_and_keep_equal_steps(svc, tmp_path):
    import torch.multiprocessing as mp

    settings = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
    with sfe.open_writer("t-skewed", SCHEMA, keys=["k"], num_subpartitions=12, bufferSize="16k",
                         **settings) as w:
        w.write(_batch(np.arange(SKEWED_ROWS), skewed=True))
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), env_path) if p)
    sys.path.insert(0, str(Path(__file__).parent))
    writer = sfe.open_writer("t-live", SCHEMA, keys=["id"], num_subpartitions=8, bufferSize="8k",
                             bufferTimeout="20ms", **settings)
    writer.write(_batch(np.arange(LIVE_FIRST), skewed=False))
    ctx = mp.start_processes(_rank_main, args=(str(tmp_path), settings), nprocs=RANKS, join=False,
                             start_method="spawn")
    try:
        deadline = time.monotonic() + 300
        while not all((tmp_path / f"first-{r}").exists() for r in range(RANKS)):
            assert time.monotonic() < deadline, "a rank never got its first batch while the exchange was written"
            assert all(p.is_alive() for p in ctx.processes), "a rank died before its first batch"
            time.sleep(0.1)
        assert writer.state == "open"  # the first batches came before the write finished
        writer.write(_batch(np.arange(LIVE_FIRST, LIVE_ROWS), skewed=False))
        writer.commit()
        while not ctx.join(timeout=5):
            assert time.monotonic() < deadline + 300, "the ranks did not finish"
    finally:
        writer.abort("test ended")
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]

    live = [np.asarray(r["live"]["ids"]) for r in ranks]
    assert ranks[0]["live"]["steps"] == ranks[1]["live"]["steps"]
    assert set(np.concatenate(live).tolist()) == set(range(LIVE_ROWS))  # every row, some repeated as pads

    everything = np.arange(SKEWED_ROWS)
    for epoch in range(3):
        both = np.concatenate([np.asarray(r[f"epoch{epoch}"]["ids"]) for r in ranks])
        assert np.array_equal(np.sort(both), everything), f"epoch {epoch}: not every row exactly once"
        assert ranks[0][f"epoch{epoch}"]["steps"] == ranks[1][f"epoch{epoch}"]["steps"]
    assert set(ranks[0]["epoch0"]["ids"]) != set(ranks[0]["epoch1"]["ids"])  # reshuffled between epochs

    resumed = np.concatenate([np.asarray(r["resume"][part]) for r in ranks for part in ("before", "after")])
    assert np.array_equal(np.sort(resumed), everything), "the resume lost or repeated rows"
    assert ranks[0]["resume"]["state"]["epoch"] == 3 and ranks[0]["resume"]["state"]["steps"] == 5

    for balance in ("drop", "pad"):
        steps = [r[balance]["steps"] for r in ranks]
        assert steps == [ranks[0][balance]["planned"]] * RANKS, (balance, steps)
        ids = np.concatenate([np.asarray(r[balance]["ids"]) for r in ranks])
        if balance == "pad":
            assert set(ids.tolist()) == set(everything.tolist())
        else:
            assert len(set(ids.tolist())) == len(ids) < SKEWED_ROWS  # skewed: the big rank lost its extra steps


def test_importing_the_package_does_not_import_torch():
    import subprocess

    code = "import sys, sparkflow_exchange as s; s.open_reader; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_bad_dataset_arguments_get_clear_errors(svc):
    from sparkflow_exchange.errors import ConfigError
    from sparkflow_exchange.torch import ExchangeDataset

    settings = {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret}
    with pytest.raises(ConfigError, match="batch_size"):
        ExchangeDataset("x", 0, **settings)
    with pytest.raises(ConfigError, match="unknown balance"):
        ExchangeDataset("x", 8, balance="fair", **settings)
    with pytest.raises(ConfigError, match="rank 2 is outside"):
        ExchangeDataset("x", 8, rank=2, world_size=2, **settings)
    ds = ExchangeDataset("x", 8, **settings)
    with pytest.raises(ConfigError, match="taken with batch_size=16, this dataset has 8"):
        ds.load_state_dict({**ds.state_dict(), "batch_size": 16})
    with pytest.raises(ConfigError, match="batch_size=None"):
        ds.loader(batch_size=4)
    with sfe.open_writer("t-strings", pa.schema([("s", pa.string()), ("k", pa.int64())]), keys=["k"],
                         num_subpartitions=2, **settings) as w:
        w.write(pa.record_batch([pa.array(["a", "b"]), pa.array([1, 2])], names=["s", "k"]))
    with pytest.raises(ConfigError, match="column 's' of type string has no tensor"):
        next(iter(ExchangeDataset("t-strings", 1, **settings)))


def test_batches_cut_from_buffer_tensors_equal_batches_cut_as_arrow():
    """The default transform makes each decoded buffer tensors once and cuts views of them: the batches must
    be those of cutting the Arrow rows first and converting each batch, for batches inside one buffer, across
    buffers and at the end."""
    from sparkflow_exchange.torch import _ArrowRows, _buffer_tensors, _cut, _TensorRows, to_tensors

    rng = np.random.default_rng(7)
    lengths = [1, 0, 700, 3, 1500, 64, 999]
    start = 0
    buffers = []
    for n in lengths:
        ids = np.arange(start, start + n, dtype=np.int64)
        buffers.append(pa.record_batch({"id": ids, "x": rng.random(n).astype(np.float32),
                                        "v": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2)), 2)}))
        start += n
    total = start
    for sizes, size in (([100] * (total // 100) + [total % 100], None), ([total], None),
                        (None, 256), (None, 1)):
        arrow = [to_tensors(b) for b in _cut(iter(buffers), sizes, size, rows=_ArrowRows)]
        tensors = list(_cut(_buffer_tensors(iter(buffers)), sizes, size, rows=_TensorRows))
        assert len(arrow) == len(tensors)
        want = sizes if sizes is not None else [size] * (total // size) + ([total % size] if total % size else [])
        assert [len(b["id"]) for b in tensors] == want
        assert torch.equal(torch.cat([b["id"] for b in tensors]), torch.arange(total))  # each row once, in order
        for a, t in zip(arrow, tensors):
            assert a.keys() == t.keys()
            for name in a:
                assert torch.equal(a[name], t[name]), name


@pytest.mark.parametrize("type_", [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(),
                                   pa.float16(), pa.float32(), pa.float64(), pa.bool_()])
def test_tensors_equal_arrow_values_for_every_numeric_type_slice_and_null(type_):
    from sparkflow_exchange.torch import to_tensors

    rng = np.random.default_rng(7)
    if pa.types.is_boolean(type_):
        values = pa.array(rng.integers(0, 2, 1000).astype(bool))
    elif pa.types.is_floating(type_):  # floats may hold nulls (NaN)
        raw = rng.normal(size=1000).astype(type_.to_pandas_dtype())
        values = pa.array(raw, type_, mask=rng.random(1000) < 0.1)
    else:
        values = pa.array(rng.integers(0, 100, 1000), type_)
    lists = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3000, dtype=np.float32)), 3)
    batch = pa.record_batch({"v": values, "l": lists})
    for start, stop in ((0, 1000), (3, 1000), (13, 517), (999, 1000)):  # offsets not on a byte or word boundary
        part = batch.slice(start, stop - start)
        got = to_tensors(part)
        want = part.column(0).to_numpy(zero_copy_only=False)
        np.testing.assert_array_equal(got["v"].numpy(), want)
        assert got["v"].numpy().dtype == want.dtype
        np.testing.assert_array_equal(got["l"].numpy(), np.arange(3000, dtype=np.float32).reshape(1000, 3)[start:stop])


def test_making_tensors_imports_no_pandas(tmp_path):
    """pandas costs half a second to import: a fresh DataLoader worker would pay it before its first batch.
    The batch reaches the fresh process as a reader gets it, decoded from Arrow IPC (which imports no pandas)."""
    from harness import fresh_python

    batch = pa.record_batch({"x": pa.array(np.ones(8, np.float32)), "y": pa.array([1.0, None] * 4),
                             "z": pa.array([True, False] * 4)})
    with pa.ipc.new_stream(tmp_path / "batch.arrows", batch.schema) as out:
        out.write_batch(batch)
    code = ("import sys, pyarrow as pa\n"
            "from sparkflow_exchange.torch import to_tensors\n"
            f"b = pa.ipc.open_stream({str(tmp_path / 'batch.arrows')!r}).read_next_batch()\n"
            "assert 'pandas' not in sys.modules, 'imported before the conversion'\n"
            "t = to_tensors(b.slice(1))\n"
            "assert t['x'].sum().item() == 7 and t['z'].sum().item() == 3 and t['y'].isnan().sum().item() == 4\n"
            "print('pandas' in sys.modules)\n")
    assert fresh_python(code) == "False"
