"""The one config object: precedence, parsing, and errors that name the problem."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkflow_exchange.config import ENV_CONF, ConfigError, ExchangeConfig, known_keys, parse_spark_defaults


def test_precedence_defaults_file_env_options(monkeypatch):
    monkeypatch.setenv(ENV_CONF, json.dumps({"bufferTimeout": "250ms", "buffersPerChannel": "3"}))
    conf = {"spark.sparkflow.exchange.bufferTimeout": "1s", "spark.sparkflow.exchange.partitionType": "BLOCKING",
            "spark.master": "local"}
    cfg = ExchangeConfig.load({"buffersPerChannel": "5"}, spark_conf=conf)
    assert cfg.partition_type == "BLOCKING"      # from the file
    assert cfg.buffer_timeout == 0.25            # env beats the file
    assert cfg.buffers_per_channel == 5          # options beat everything
    assert cfg.floating_buffers_per_gate == 8    # default


def test_options_are_case_insensitive_and_values_parsed():
    cfg = ExchangeConfig.load({"BUFFERSIZE": "512k", "declaretimeout": "2min", "keys": "a, b", "memory.budget": "1g"},
                              spark_conf={})
    assert cfg.buffer_size == 512 * 1024
    assert cfg.declare_timeout == 120.0
    assert cfg.keys == ("a", "b")
    assert cfg.memory_budget == 1 << 30


@pytest.mark.parametrize("options, message", [
    ({"bufferSzie": "1k"}, r"unknown option 'bufferSzie' \(did you mean 'bufferSize'\?\)"),
    ({"bufferSize": "lots"}, "not a size: 'lots'"),
    ({"declareTimeout": "soon"}, "not a duration: 'soon'"),
    ({"partitionType": "PIPELINED"}, "unknown partitionType 'PIPELINED'"),
    ({"compression": "gzip"}, "unknown compression 'gzip'"),
    ({"numSubpartitions": "0"}, "numSubpartitions must be at least 1"),
    ({"serviceScope": "rack"}, "unknown serviceScope 'rack'"),
])
def test_bad_settings_are_named(options, message):
    with pytest.raises(ConfigError, match=message):
        ExchangeConfig.load(options, spark_conf={})


def test_unknown_key_in_spark_defaults_names_the_file():
    with pytest.raises(ConfigError, match="spark-defaults.conf .*spark.sparkflow.exchange.nope"):
        ExchangeConfig.load({}, spark_conf={"spark.sparkflow.exchange.nope": "1"})


def test_spark_defaults_parsing_and_env_dir(tmp_path, monkeypatch):
    assert parse_spark_defaults("# c\nspark.a  1\nspark.b=2\n\nspark.c\t x y\n") == {
        "spark.a": "1", "spark.b": "2", "spark.c": "x y"}
    (tmp_path / "spark-defaults.conf").write_text("spark.sparkflow.exchange.compression zstd\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv(ENV_CONF, raising=False)
    assert ExchangeConfig.load({}).compression == "zstd"


def test_to_keys_round_trips():
    cfg = ExchangeConfig.load({"keys": "a,b", "bufferSize": "64k", "ttl": "5s"}, spark_conf={})
    assert ExchangeConfig.from_keys(cfg.to_keys()) == cfg


def test_conf_example_lists_every_key():
    text = (Path(__file__).parent.parent / "conf" / "spark-defaults.conf").read_text()
    missing = [k for k in known_keys() if f"spark.sparkflow.exchange.{k}" not in text]
    assert not missing, f"conf/spark-defaults.conf lacks {missing}"


def test_sizes_and_durations_are_read_as_the_contract_says():
    """The suffix tables are the contract's (the JVM's are generated from it; tests/test_contract.py runs the
    contract's cases through both parsers): ``1mib`` is a size on both sides, a fractional size on neither."""
    from sparkflow_exchange import contract
    from sparkflow_exchange.config import _SIZE_UNITS, _TIME_UNITS, parse_duration, parse_size

    units = contract.load()["units"]
    assert (_SIZE_UNITS, _TIME_UNITS) == (units["size_suffixes"], units["duration_suffixes"])
    assert parse_size("1mib") == parse_size("1m") == parse_size(" 1 MB ") == 1 << 20
    for bad in ("1ib", "1.5m", "1t", "m", "\u0661k", True, -1):
        with pytest.raises(ConfigError, match="not a size"):
            parse_size(bad)
    for bad in ("1d", "-1", "1e3", True, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="not a duration"):
            parse_duration(bad)
    with pytest.raises(ConfigError, match="bufferSize 1073741824 must be at most half of maxFrameSize"):
        ExchangeConfig.load({"bufferSize": "1g"}, spark_conf={})
