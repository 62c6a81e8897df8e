"""Exchanges written through the JVM catalog (``df.writeTo("exchange.<name>")``: create, append, createOrReplace)
in one real local application with the plugin jar (tests/app_jvm_write.py): rows equal the source DataFrame's, read
by the Python reader, ``open_reader`` and the catalog; every row sits in the partition ``repartition(n, keys)``
gives it; a JVM write and read start no Python worker, through the catalog and through ``format("pipelined")``, which
hands the options the JVM path does not serve to the Python data source. The checks run in one application with
tests/test_jvm_catalog.py's (tests/app_jvm_write_and_catalog.py). Builds the plugin jar; 2-6 min on a busy 2-core
machine."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_app_with_jar

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


@pytest.fixture(scope="module")
def results(jvm_write_and_catalog) -> dict:
    """tests/app_jvm_write.py's checks, run with tests/app_jvm_catalog.py's in one application."""
    return jvm_write_and_catalog


def passed(results: dict, name: str) -> dict:
    outcome = results[name]
    assert outcome["ok"], f"{name}: {outcome.get('error')}\n{outcome.get('trace', '')}"
    return outcome


def test_a_jvm_write_and_read_start_no_python_worker(results):
    outcome = passed(results, "no_python_worker")
    assert outcome["rows"] == 2000
    assert outcome["factories_after"] == 0 and outcome["workers_seen"] == []


def test_format_pipelined_writes_and_reads_through_the_jvm_with_no_python_worker(results):
    outcome = passed(results, "format_pipelined_is_served_by_the_jvm")
    assert outcome["factories_after"] == 0 and outcome["workers_seen"] == []


def test_format_pipelined_hands_what_the_jvm_does_not_serve_to_the_python_source(results):
    assert "already exists" in passed(results, "format_pipelined_hands_the_rest_to_the_python_source")["error_mode"]


def test_decimals_at_and_beyond_a_long_round_trip_exactly(results):
    outcome = passed(results, "decimals_round_trip_exactly_around_a_long")
    assert outcome["dec_38_4"] == 11 and outcome["dec_20_0"] > 0 and outcome["dec_15_2"] > 0, outcome


def test_create_hashed_on_one_key_reads_the_source_rows_where_repartition_puts_them(results):
    assert passed(results, "create_hash_one_key")["partitioner"]["keys"] == ["k"]


def test_two_keys_append_adds_rows_and_create_or_replace_replaces_them(results):
    assert passed(results, "two_keys_append_and_create_or_replace")["rows_after_append"] == 3000


def test_partitioned_by_bucket_is_the_hash_on_its_column(results):
    passed(results, "bucket_transform_is_a_hash")


def test_python_and_jvm_written_exchanges_read_the_same_through_every_reader(results):
    passed(results, "python_and_jvm_writes_read_through_the_catalog")


def test_a_jvm_append_extends_a_python_written_exchange(results):
    passed(results, "jvm_append_to_a_python_exchange")


def test_broadcast_rebalance_and_forward(results):
    assert passed(results, "other_partitioners")["rebalance_counts"] == [80] * 5


def test_a_missing_key_fails_at_planning_and_declares_nothing(results):
    passed(results, "bad_options_fail_at_planning")


def test_replicas_as_a_session_setting_go_to_the_python_writer_which_refuses_one_host(results):
    message = passed(results, "replicas_go_to_the_python_writer_and_need_a_second_host")["message"]
    assert "on 1 host" in message and "replicas=0" in message, message


def test_a_reader_gets_the_rows_of_a_write_still_running(results):
    outcome = passed(results, "a_write_in_progress_is_read_as_it_goes")
    assert outcome["rows"] == 100_000 and outcome["writing_at_first_rows"]


def test_nested_types_written_in_many_buffers_read_back_exactly(results):
    outcome = passed(results, "nested_types_in_many_buffers")
    assert outcome["catalog"] == outcome["python"] == 4000


def test_a_catalog_with_commit_timeout_reads_an_exchange_once_its_write_commits(results):
    outcome = passed(results, "a_catalog_with_commit_timeout_waits_for_the_commit")
    assert outcome["waited_s"] >= 3.0


def test_format_reads_an_exchange_being_written_in_the_jvm_as_it_goes(results):
    outcome = passed(results, "format_reads_a_write_in_progress_in_the_jvm")
    assert "read while written" in outcome["plan"]
    assert outcome["reading_before_second_producer"] and outcome["reading_before_commit"]


def test_a_read_in_progress_never_returns_rows_the_commit_does_not_hold(results):
    outcome = passed(results, "a_read_in_progress_fails_rather_than_return_rows_the_commit_does_not_hold")
    assert "which the commit does not hold" in outcome["lost_commit"]
    assert "was aborted" in outcome["aborted"]


def test_a_format_read_waits_for_its_exchange_to_be_declared_then_reads_it_in_the_jvm(results):
    outcome = passed(results, "format_read_waits_for_its_exchange_to_be_declared")
    assert outcome["planned_before_declared"]
    assert "does not exist" in outcome["missing"]


def test_a_catalog_reads_an_exchange_being_written_laid_out_to_the_task_slots(results):
    outcome = passed(results, "a_catalog_reads_as_the_producers_write")
    assert "read while written" in outcome["plan"] and outcome["reading_before_commit"]


def test_an_append_in_another_layout_is_refused_on_every_writer_and_spark_groups_correctly(results):
    outcome = passed(results, "an_append_in_another_layout_is_refused_on_every_writer")
    assert outcome["groups_lay_jvm"] == outcome["groups_lay_py"] == 50


def test_key_filters_resolve_columns_as_spark_does_on_both_jar_readers(results):
    passed(results, "key_filters_resolve_columns_as_spark_does")


def test_a_failed_write_through_the_jar_changes_nothing(results):
    outcome = passed(results, "a_failed_write_through_the_jar_changes_nothing")
    assert "at most half of maxFrameSize" in outcome["jvm_buffer_size"]


def test_a_broadcast_read_gives_every_read_partition_exactly_one_copy(results):
    passed(results, "a_broadcast_read_gives_every_read_partition_one_copy")


def test_a_dataframe_without_columns_keeps_its_rows_or_is_refused(results):
    assert passed(results, "a_dataframe_without_columns_keeps_its_rows_or_is_refused")["jvm_rows"] == 5


def test_collated_keys_are_refused_on_both_writers(results):
    outcome = passed(results, "collated_keys_are_refused_on_both_writers")
    assert "UTF8_LCASE" in outcome["jvm"] and "UTF8_LCASE" in outcome["python"], outcome


def test_a_jar_added_to_a_running_session_writes_every_row_or_fails_clearly(tmp_path, jar):
    """ADD JAR in a session started without the jar, then a format("pipelined") write of 100,000 rows: every row
    committed and read back by both readers, or the write fails naming the cause; never an empty committed exchange."""
    from sparkflow_exchange.service.process import stop_embedded

    try:
        out, _proc = run_app_with_jar(tmp_path, (Path(__file__).parent / "app_add_jar.py").read_text(), jar, timeout=600)
    finally:
        stop_embedded(tmp_path / "runtime")
    if out["written"]:
        assert out["jvm_rows"] == out["python_rows"] == 100_000, out
        assert [(e["state"], e["rows"]) for e in out["listed"]] == [("committed", 100_000)], out
    else:
        assert "ADD JAR" in out["error"] or "commit messages" in out["error"], out["error"]
        assert all(e["state"] != "committed" or e["rows"] for e in out["listed"]), out


def test_compressed_exchanges_round_trip_between_the_jvm_and_python(results):
    outcome = passed(results, "compressed_exchanges_round_trip_on_every_path")
    assert "unknown compression 'gzip'" in outcome["jvm_bad"] and "unknown compression 'gzip'" in outcome["python_bad"]
    assert outcome["bytes_lz4"] < 0.8 * outcome["bytes_none"] and outcome["bytes_zstd"] < 0.8 * outcome["bytes_none"]
