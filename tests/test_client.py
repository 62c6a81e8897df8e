"""open_reader / open_writer: exchanges read and written by plain Python, against a real service."""
from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from harness import fresh_python

import sparkflow_exchange as sfe
from sparkflow_exchange import ConfigError, ExchangeError, SchemaMismatch
from sparkflow_exchange.writer.spark_hash import spark_partition_ids

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("k", pa.string()),
                    pa.field("x", pa.float64())])


def _batch(start: int, n: int) -> pa.RecordBatch:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.record_batch([pa.array(ids), pa.array([f"key{i % 97}" for i in ids]), pa.array(ids * 0.5)],
                           schema=SCHEMA)


def _placement(table: pa.Table, n: int) -> np.ndarray:
    """Spark's ``repartition(n, "k")`` partition of every row."""
    return np.asarray(spark_partition_ids(table, ["k"], n))


def _settings(svc, **extra) -> dict:
    return {"coordinator": svc.tcp, "service": svc.tcp, "secret": svc.secret, **extra}


@pytest.fixture
def svc(tmp_service):
    return tmp_service()


def _write(svc, name: str, rows: int, n: int = 4, **extra) -> None:
    with sfe.open_writer(name, SCHEMA, keys=["k"], num_subpartitions=n, **_settings(svc, **extra)) as w:
        for start in range(0, rows, 1000):
            w.write(_batch(start, min(1000, rows - start)))


def test_written_rows_are_read_back_each_in_its_spark_hash_subpartition(svc):
    _write(svc, "c-hash", 5000, bufferSize="16k")
    for sub in range(4):
        table = sfe.open_reader("c-hash", subpartitions=sub, **_settings(svc)).read_all()
        assert table.num_rows > 0
        assert set(_placement(table, 4).tolist()) == {sub}
    whole = sfe.open_reader("c-hash", **_settings(svc)).read_all()
    assert sorted(whole.column("id").to_pylist()) == list(range(5000))
    assert whole.schema.equals(SCHEMA)


def test_columns_and_subpartitions_are_chosen_in_the_call(svc):
    _write(svc, "c-proj", 3000)
    reader = sfe.open_reader("c-proj", subpartitions=[3, 1], columns=["x", "id"], **_settings(svc))
    assert reader.schema.names == ["x", "id"]
    got = reader.read_all()
    every = sfe.open_reader("c-proj", **_settings(svc)).read_all()
    ids = every.column("id").to_numpy()
    subs = _placement(every, 4)
    assert sorted(got.column("id").to_pylist()) == sorted(ids[np.isin(subs, [1, 3])].tolist())
    assert pc.all(pc.equal(got.column("x"), pc.multiply(pc.cast(got.column("id"), pa.float64()), 0.5))).as_py()


def test_reader_is_an_arrow_c_stream(svc):
    _write(svc, "c-capsule", 1200)
    reader = sfe.open_reader("c-capsule", **_settings(svc))
    assert hasattr(reader, "__arrow_c_stream__")
    table = pa.table(reader)  # through the C stream interface
    assert table.num_rows == 1200


def test_reader_opened_before_the_write_reads_it_while_written(svc):
    got: list = []
    errors: list = []
    name = "c-live"
    started = threading.Event()
    release = threading.Event()

    def write():
        try:
            with sfe.open_writer(name, SCHEMA, keys=["k"], num_subpartitions=3,
                                 **_settings(svc, bufferSize="8k", bufferTimeout="10ms")) as w:
                w.write(_batch(0, 2000))
                started.set()
                assert release.wait(60), "the reader never took a first batch"
                w.write(_batch(2000, 2000))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            started.set()

    t = threading.Thread(target=write)
    t.start()
    assert started.wait(60)
    reader = sfe.open_reader(name, **_settings(svc))
    first = reader.read_next_batch()  # the write is not committed: it waits for release
    got.append(first)
    release.set()
    got.extend(reader)
    t.join(60)
    assert not errors
    ids = pa.Table.from_batches(got).column("id").to_pylist()
    assert sorted(ids) == list(range(4000))


def test_pipelined_bounded_exchange_is_read_whole_while_written(svc):
    # every subpartition at once: reading them in turn would leave the writer blocked on one nobody reads
    name = "c-bounded"
    box: list = []
    t = threading.Thread(target=lambda: box.append(sfe.open_reader(name, **_settings(svc)).read_all()))
    t.start()
    _write(svc, name, 20_000, n=3, partitionType="PIPELINED_BOUNDED", bufferSize="4k", buffersPerPartition="2")
    t.join(120)
    assert not t.is_alive()
    assert sorted(box[0].column("id").to_pylist()) == list(range(20_000))


def test_an_exception_aborts_the_write_and_leaves_the_committed_version(svc):
    _write(svc, "c-abort", 1000)
    with pytest.raises(RuntimeError, match="boom"):
        with sfe.open_writer("c-abort", SCHEMA, keys=["k"], num_subpartitions=4, **_settings(svc)) as w:
            w.write(_batch(0, 500))
            raise RuntimeError("boom")
    assert w.state == "aborted"
    # a failed overwrite changes nothing: the committed version is read, every row
    assert sorted(sfe.open_reader("c-abort", **_settings(svc)).read_all().column("id").to_pylist()) == list(range(1000))
    with pytest.raises(ExchangeError, match="aborted"):
        w.write(_batch(0, 1))


def test_append_adds_a_second_producer_to_the_same_epoch(svc):
    _write(svc, "c-append", 1000)
    with sfe.open_writer("c-append", SCHEMA, keys=["k"], num_subpartitions=4, mode="append", **_settings(svc)) as w:
        w.write(_batch(1000, 1000))
    ids = sfe.open_reader("c-append", **_settings(svc)).read_all().column("id").to_pylist()
    assert sorted(ids) == list(range(2000))


def test_committed_counts_per_subpartition_are_published(svc):
    _write(svc, "c-counts", 3000)
    plan = sfe.client.read_plan("c-counts", **_settings(svc))
    per_sub = [sfe.open_reader("c-counts", subpartitions=s, **_settings(svc)).read_all().num_rows for s in range(4)]
    assert list(plan.subpartition_rows) == per_sub and sum(per_sub) == 3000


@pytest.mark.parametrize("call, message", [
    (lambda s: sfe.open_reader("c-bad", subpartitions=[4], **s), r"subpartitions \[4\] are outside"),
    (lambda s: sfe.open_reader("c-bad", subpartitions=[1, 1], **s), "more than once"),
    (lambda s: sfe.open_reader("c-bad", subpartitions="0", **s), "must be"),
    (lambda s: sfe.open_reader("c-bad", columns=["nope"], **s), "has no column 'nope'"),
    (lambda s: sfe.open_reader("c-bad", columns="id", **s), "sequence of column names"),
    (lambda s: sfe.open_reader("c-bad", declareTimout=1, **s), "did you mean 'declareTimeout'"),
    (lambda s: sfe.open_reader("c-none", declare_timeout=0.2, **s), "does not exist"),
    (lambda s: sfe.open_writer("c-bad2", SCHEMA, keys=["nope"], **s), "key 'nope' is not a column"),
    (lambda s: sfe.open_writer("c-bad2", SCHEMA, **s), "needs keys"),
    (lambda s: sfe.open_writer("c-bad2", SCHEMA, keys=["k"], partitioner="hsah", **s), "unknown partitioner"),
    (lambda s: sfe.open_writer("c-bad2", SCHEMA, keys=["k"], mode="upsert", **s), "unknown mode"),
    (lambda s: sfe.open_writer("c-bad2", {"id": "int"}, keys=["k"], **s), "pyarrow.Schema"),
    (lambda s: sfe.open_writer("", SCHEMA, keys=["k"], **s), "non-empty name"),
])
def test_bad_arguments_get_clear_errors(svc, call, message):
    _write(svc, "c-bad", 100)
    with pytest.raises((ConfigError, ExchangeError), match=message):
        call(_settings(svc))


def test_a_batch_of_another_schema_is_refused_and_the_write_stays_usable(svc):
    with sfe.open_writer("c-schema", SCHEMA, keys=["k"], num_subpartitions=2, **_settings(svc)) as w:
        with pytest.raises(SchemaMismatch, match="batch has"):
            w.write(pa.record_batch([pa.array([1])], names=["id"]))
        w.write(_batch(0, 10))
    assert sfe.open_reader("c-schema", **_settings(svc)).read_all().num_rows == 10


def test_writing_and_reading_import_no_pandas(svc, tmp_path):
    """pyarrow imports pandas the first time it converts from NumPy or Python objects: half a second in each
    fresh Spark worker before its first rows. The data path converts none: a write hashed on keys of several
    types and its read, in a fresh process whose batch arrives as Arrow IPC (as a Spark worker's does)."""
    n = 1000
    batch = pa.record_batch({"id": pa.array(np.arange(n)), "s": pa.array([f"k{i % 13}" for i in range(n)]),
                             "l": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int32())),
                             "d": pa.array(np.arange(n) / 7)})
    with pa.ipc.new_stream(tmp_path / "batch.arrows", batch.schema) as out:
        out.write_batch(batch)
    code = (
        "import sys, pyarrow as pa, sparkflow_exchange as sfe\n"
        f"settings = {_settings(svc)!r}\n"
        f"b = pa.ipc.open_stream({str(tmp_path / 'batch.arrows')!r}).read_next_batch()\n"
        "assert 'pandas' not in sys.modules, 'imported before the write'\n"
        "with sfe.open_writer('no_pandas', b.schema, keys=['id', 's', 'l'], num_subpartitions=8, **settings) as w:\n"
        "    w.write(b)\n"
        "    w.write(b.slice(17, 300))\n"
        "rows = sum(x.num_rows for x in sfe.open_reader('no_pandas', **settings))\n"
        "print(rows, 'pandas' in sys.modules)\n")
    assert fresh_python(code).split() == [str(n + 300), "False"]
