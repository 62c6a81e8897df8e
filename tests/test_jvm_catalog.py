"""Exchanges read through the JVM catalog (``spark.sql.catalog.exchange=...ExchangeCatalog``) in a real local
application with the plugin jar: Spark plans groupBy and same-width joins on the hash key without a shuffle, every
answer equals parquet's, partitions equal the Python reader's, and damaged or missing spill files fail naming the
exchange, producer and subpartition. The checks (tests/app_jvm_catalog.py) run in one application with
tests/test_jvm_write.py's (tests/app_jvm_write_and_catalog.py); builds the plugin jar; 2-6 min on a busy 2-core
machine."""
from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


@pytest.fixture(scope="module")
def results(jvm_write_and_catalog) -> dict:
    """Every group of checks, in one application (with tests/app_jvm_write.py's checks)."""
    return jvm_write_and_catalog


@pytest.fixture(scope="module")
def plans(results) -> dict:
    return results


@pytest.fixture(scope="module")
def layouts(results) -> dict:
    return results


@pytest.fixture(scope="module")
def failures(results) -> dict:
    return results


def passed(results: dict, name: str) -> dict:
    outcome = results[name]
    assert outcome["ok"], f"{name}: {outcome.get('error')}\n{outcome.get('trace', '')}\n{outcome.get('plan', '')}"
    return outcome


def test_show_tables_lists_the_exchanges(plans):
    assert {"t8a", "t8b"} <= set(passed(plans, "tables")["names"])


def test_group_by_the_hash_key_plans_no_shuffle_and_equals_parquet(plans):
    outcome = passed(plans, "group_by_key")
    assert outcome["shuffles"] == []
    assert "BatchScan" in outcome["plan"] and "HashAggregate" in outcome["plan"]


def test_join_of_two_exchanges_of_the_same_width_plans_no_shuffle_and_equals_parquet(plans):
    outcome = passed(plans, "join_same_width")
    assert outcome["shuffles"] == []
    assert "SortMergeJoin" in outcome["plan"]
    assert outcome["rows"] > 0


def test_sql_select_with_filter_and_group_by_equals_parquet(plans):
    assert "Exchange" not in passed(plans, "sql_select")["plan"]


def test_read_partitions_equal_the_python_readers_and_sparks_hash_placement(plans):
    assert passed(plans, "partition_ids")["partitions"] == 8


def test_small_exchanges_are_read_in_fewer_partitions_still_key_grouped(plans):
    outcome = passed(plans, "grouped_read_partitions")
    assert outcome["default_partitions"] < 8
    assert "give a divisor of 8" in outcome["refused"]


def test_an_equality_or_in_filter_on_the_hash_key_reads_only_its_subpartitions(plans):
    outcome = passed(plans, "key_filters_prune_subpartitions")
    assert len(outcome["plans"]) == 3


def test_two_key_exchange_reads_exactly_and_aggregates_correctly(layouts):
    outcome = passed(layouts, "two_keys")
    # Spark accepts one bucket column: no partitioning is claimed, so it shuffles (correctly) for groupBy(k, j)
    assert "Exchange hashpartitioning" in outcome["plan"]


def test_join_of_different_widths_is_correct(layouts):
    passed(layouts, "different_widths")


def test_exchanges_read_at_different_widths_join_without_shuffle_when_compatible(layouts):
    assert "SortMergeJoin" in passed(layouts, "different_read_partitions_reduce_to_a_common_divisor")["plan"]


def test_exchange_without_explicit_width_reads_every_row_once(layouts):
    outcome = passed(layouts, "coalesced_width")
    assert 1 <= outcome["partitions"] <= outcome["subpartitions"] == 4


def test_spark_placing_the_other_join_side_with_the_bucket_function_gives_the_right_answer(layouts):
    outcome = passed(layouts, "bucket_function_shuffles_the_other_side")
    # only the plain side is shuffled, by the exchange's bucket function
    assert len(re.findall(r"Exchange ", outcome["plan"])) == 1, outcome["plan"]


def test_statistics_are_the_coordinators_and_columns_are_pruned(plans):
    outcome = passed(plans, "statistics_and_pruning")
    assert outcome["rows"] == 3000
    assert 0 < outcome["bytes"] == outcome["exchange_bytes"]


def test_many_types_read_exactly_and_a_string_key_is_placed_as_spark_would(layouts):
    outcome = passed(layouts, "types")
    assert set(outcome["pruned"]) == {"key", "i", "m", "bin", "day", "ts"}


def test_drop_table_drops_the_exchange(failures):
    passed(failures, "drop_table")


def test_producers_of_another_host_are_read_from_their_services_exactly(failures):
    assert passed(failures, "remote_read")["rows"] == 3000


def test_a_damaged_spill_file_fails_naming_exchange_producer_and_subpartition(failures):
    outcome = passed(failures, "corrupt_spill_file")
    for key in ("message", "remote_message"):  # read from the file here, and through its service
        assert key in outcome, f"the read of a damaged exchange returned rows ({key})"
        assert f"corrupt data in {outcome['expected']}: checksum mismatch" in outcome[key], outcome[key]


def test_a_missing_spill_file_fails_naming_exchange_producer_and_subpartition(failures):
    outcome = passed(failures, "missing_spill_file")
    assert "message" in outcome, "the read of an exchange without its spill file returned rows"
    assert re.search(rf"lost data in exchange 'vanished', {re.escape(outcome['producer'])}, subpartition \d: "
                     r"its spill file \S+ cannot be opened", outcome["message"]), outcome["message"]


def test_a_wrong_secret_is_refused_and_the_right_one_accepted(failures):
    outcome = passed(failures, "wrong_secret")
    assert outcome["has_secret"]
    assert "authentication failed: wrong secret" in outcome["message"]
    assert outcome["friends_rows"] == 3000
