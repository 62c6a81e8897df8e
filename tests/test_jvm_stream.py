"""Streams through the plugin jar's JVM stream source and sink, in one real local application
(tests/app_jvm_stream.py): a stream written by the JVM sink is read exactly by the Python source; a stream written by
the Python sink is read exactly by the JVM source in micro-batches and by a chain of two Real-time Mode queries
through two exchanges (the second written by the JVM sink), every row in order per key; the chain's first query
restarted from its checkpoint (offsets per subpartition) writes only the new epoch's rows; each query's route is the
one the docs name; writeStream.toTable through the catalog."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_app_with_jar

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

APP = (Path(__file__).parent / "app_jvm_stream.py").read_text()


@pytest.fixture(scope="module")
def results(tmp_path_factory, jar) -> dict:
    from sparkflow_exchange.service.process import stop_embedded

    work = tmp_path_factory.mktemp("jvm-stream")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JVM_STREAM_WORK", str(work / "data"))
        try:
            result, _proc = run_app_with_jar(work, APP, jar, timeout=900)
        finally:
            stop_embedded(work / "runtime")
    return result


def passed(results: dict, name: str) -> dict:
    outcome = results[name]
    assert outcome["ok"], f"{name}: {outcome.get('error')}\n{outcome.get('trace', '')}"
    return outcome


def test_jvm_written_stream_is_read_exactly_by_the_python_source(results):
    outcome = passed(results, "jvm_sink_read_by_python")
    assert outcome["sink"] == "sparkflow-exchange stream jv (JVM sink)"
    assert all("PythonMicroBatchStream" in s for s in outcome["python_sources"]), outcome["python_sources"]
    assert outcome["catalog_streaming"] is True


def test_python_written_stream_is_read_exactly_by_the_jvm_source_and_a_real_time_chain_restarts_exactly(results):
    outcome = passed(results, "python_sink_read_by_jvm_micro_batches_and_a_real_time_chain")
    assert "JVM" not in outcome["sink"], outcome["sink"]  # jvmFormat=false: the Python sink wrote it
    assert outcome["sources"] == ["sparkflow-exchange stream py (JVM)"]
    assert outcome["batch_rows"] == [3000, 3000, 3000]  # maxEpochsPerTrigger=1: one writer epoch per micro-batch
    assert outcome["hop_sources"] == ["sparkflow-exchange stream py (JVM)", "sparkflow-exchange stream jv2 (JVM)"]
    assert outcome["chain_rows"] == 9000  # Real-time Mode reads the Python-written stream, every row in key order
    assert outcome["rows_after_restart"] == 12000  # 9000 before the restart, the new epoch's 3000, none twice


def test_write_stream_to_table_is_served_by_the_jvm_sink_and_read_back_exactly(results):
    outcome = passed(results, "to_table")
    assert outcome["sink"] == "sparkflow-exchange stream tt (JVM sink)"
    assert "cannot serve this query (no numSubpartitions): give it numSubpartitions" in outcome["refused"], \
        outcome["refused"]
