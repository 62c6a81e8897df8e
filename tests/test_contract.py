"""Python and the JVM plugin agree with the contract file (sparkflow_exchange/contract.json), constant by constant.

Python's definitions (message types, error codes, enums, layouts) are compared with the file; the jar's generated
``Contract`` class and the constants its classes use (``Frames``, ``SpillIndex``, the trailers, the partitioner lists)
are read back from a built jar by a small Java driver (no Spark). The Java sources are also scanned for error codes
and states written as string literals where they are compared or thrown. So a constant changed in one language only
fails here.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from jvm_units import compile_driver

from sparkflow_exchange import buffer, buffer_kinds, config, contract, kinds
from sparkflow_exchange.errors import ErrorCode
from sparkflow_exchange.network import protocol
from sparkflow_exchange.partition import spill
from sparkflow_exchange.service import exchanges as exchange_model
from sparkflow_exchange.writer import selectors

C = contract.load()
JAVA = Path(__file__).resolve().parent.parent / "jvm-stub" / "src" / "main" / "java"


def members(enum_cls) -> dict:
    return {m.name: m.value for m in enum_cls}


# ------------------------------------------------------------------ the file is consistent with itself
def test_the_contracts_sizes_are_those_of_its_layouts():
    assert contract.layout(C["frame"]["prefix"]).size == C["frame"]["prefix_size"]
    assert contract.layout(C["buffer"]["trailer"]).size == C["buffer"]["trailer_size"]
    assert contract.layout(C["buffer"]["end_counts"]).size == C["buffer"]["end_counts_size"]
    assert contract.layout(C["spill_index"]["entry"]).size == C["spill_index"]["entry_size"]
    assert int.from_bytes(C["frame"]["magic_text"].encode("ascii"), "big") == C["frame"]["magic"]
    assert C["spill_index"]["magic"].endswith("%02d" % C["spill_index"]["version"])
    assert len(set(C["message_types"].values())) == len(C["message_types"])  # no number used twice
    assert len(set(C["error_codes"].values())) == len(C["error_codes"])


def test_a_layout_with_an_unknown_field_type_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown field type 'f32'"):
        contract.layout([["x", "f32"]])


def test_the_jar_build_says_when_the_contract_is_missing_or_not_a_contract(tmp_path):
    from sparkflow_exchange import build_plugin

    with pytest.raises(build_plugin.BuildError, match="missing.json is missing"):
        build_plugin.generate_contract(tmp_path, tmp_path / "missing.json")
    (tmp_path / "partial.json").write_text('{"frame": {}}')
    with pytest.raises(build_plugin.BuildError, match="partial.json is not a valid contract"):
        build_plugin.generate_contract(tmp_path, tmp_path / "partial.json")
    generated = build_plugin.generate_contract(tmp_path)
    assert generated.name == "Contract.java" and "int HELLO = 2;" in generated.read_text()


# ------------------------------------------------------------------ Python agrees with the file
def test_python_frames_and_message_types_are_the_contracts():
    frame = C["frame"]
    assert (protocol.MAGIC, protocol.VERSION, protocol.PREFIX_SIZE, protocol.DEFAULT_MAX_FRAME) == \
        (frame["magic"], frame["version"], frame["prefix_size"], frame["max_frame"])
    assert protocol.PREFIX.format == contract.layout(frame["prefix"]).format
    assert members(protocol.MsgType) == C["message_types"]
    headers = {"BUFFER_RESPONSE": protocol._BUFFER_RESPONSE, "ADD_CREDIT": protocol._ADD_CREDIT,
               "PUSH_BUFFER": protocol._PUSH_BUFFER, "PRODUCER_CREDIT": protocol._PRODUCER_CREDIT}
    assert {name: s.format for name, s in headers.items()} == \
        {name: contract.layout(fields).format for name, fields in C["data_headers"].items()}


def test_python_json_headers_are_the_contracts():
    """Each JSON header the JVM writes field by field: Python's dataclass has the contract's fields, in its order,
    with its types (``?``: may be null)."""
    import typing

    python_types = {"string": (str,), "int": (int,), "bool": (bool,)}
    messages = {"PARTITION_REQUEST": protocol.PartitionRequest}
    declared = {name: fields for name, fields in C["json_headers"].items() if name != "about"}
    assert set(declared) == set(messages)
    for name, cls in messages.items():
        hints = typing.get_type_hints(cls)
        assert [f for f, _ in declared[name]] == list(hints), name
        for field, kind in declared[name]:
            allowed = set(python_types[kind.rstrip("?")]) | ({type(None)} if kind.endswith("?") else set())
            assert set(typing.get_args(hints[field]) or (hints[field],)) == allowed, (name, field)


def test_python_error_codes_are_the_contracts():
    assert members(ErrorCode) == C["error_codes"]


def test_python_partition_types_and_their_properties_are_the_contracts():
    assert {t.name: {"re_readable": t.re_readable, "consume_once": t.consume_once} for t in kinds.PartitionType} == \
        C["partition_types"]
    assert kinds.PARTITION_TYPES == tuple(C["partition_types"])


def test_python_partitioners_and_their_properties_are_the_contracts():
    assert tuple(kinds.Partitioner) == tuple(C["partitioners"])
    assert {p.value: {"keyed": p.keyed, "single_subpartition": p.single_subpartition} for p in kinds.Partitioner} == \
        {n: {"keyed": p["keyed"], "single_subpartition": p["single_subpartition"]} for n, p in C["partitioners"].items()}
    single = {n for n, p in C["partitioners"].items() if p["single_subpartition"]}
    assert set(config.SINGLE_SUBPARTITION) == single
    assert set(exchange_model.FORWARD_LIKE) == single
    schema = pa.schema([("k", pa.int64())])
    for name, props in C["partitioners"].items():
        if name == "custom":
            continue  # needs its function, not keys
        if props["keyed"]:
            with pytest.raises(selectors.SelectorError, match="needs the 'keys' option"):
                selectors.make_selector(name, 2, 0, schema, keys=())
        else:
            selectors.make_selector(name, 2, 0, schema, keys=(), num_producers=2)


def test_python_states_and_kinds_are_the_contracts():
    assert members(kinds.ExchangeState) == C["exchange_states"]
    assert members(kinds.PartitionState) == C["partition_states"]
    assert members(kinds.ExchangeKind) == C["exchange_kinds"]


def test_python_buffer_kinds_flags_trailer_and_end_counts_are_the_contracts():
    b = C["buffer"]
    assert members(buffer_kinds.BufferKind) == b["kinds"]
    assert {"COMPRESSED": buffer_kinds.FLAG_COMPRESSED, "SHARED": buffer_kinds.FLAG_SHARED} == b["flags"]
    assert buffer_kinds.BROADCAST == b["broadcast_subpartition"]
    assert buffer.TRAILER.format == contract.layout(b["trailer"]).format
    assert buffer_kinds.END_COUNTS.format == contract.layout(b["end_counts"]).format


def test_python_spill_index_layout_is_the_contracts():
    s = C["spill_index"]
    assert spill.INDEX_MAGIC == s["magic"].encode("ascii")
    assert spill.INDEX_ENTRY.format == contract.layout(s["entry"]).format
    assert spill._index_dtype().itemsize == s["entry_size"]
    assert spill._KINDS == tuple(C["buffer"]["kinds"].values())
    assert spill._END_OF_PARTITION == C["buffer"]["kinds"]["END_OF_PARTITION"]


def _python_value(value):
    """A setting's value as the contract writes it (an enum as its value, a tuple as a list)."""
    if isinstance(value, tuple):
        return list(value)
    return getattr(value, "value", value)


def test_python_settings_are_the_contracts_options():
    """Every key Python reads, its parser (by type) and its default are the contract's; the JVM-only keys are not
    Python's."""
    options = C["options"]["keys"]
    python = {k: spec for k, spec in options.items() if "python" in spec["languages"]}
    assert set(config._KEYS) == set(python)
    defaults = config.ExchangeConfig()
    assert {k: _python_value(getattr(defaults, config._KEYS[k][0])) for k in python} == \
        {k: spec["default"] for k, spec in python.items()}
    by_type = {"size": config.parse_size, "duration": config.parse_duration, "bool": config._bool, "int": int,
               "float": float, "string": str}
    for key, spec in python.items():
        parse = config._KEYS[key][1]
        if spec["type"] in by_type and spec["default"] is not None:
            assert parse is by_type[spec["type"]], key
        elif spec["type"] == "choice":
            assert parse("aB") == ("AB" if spec["case"] == "upper" else "ab"), key
    assert config.PREFIX == C["options"]["prefix"]
    assert config.COMPRESSIONS == tuple(options["compression"]["choices"])
    for key, spec in options.items():
        assert set(spec["applies"]) <= {"read", "write", "stream", "service", "catalog"}, key
        assert spec["languages"] and set(spec["languages"]) <= {"python", "jvm"}, key
        assert ("unit" in spec) == (spec["type"] in ("size", "duration")), key
        choices = spec.get("choices", [])
        choices = list(C[choices[1:]]) if isinstance(choices, str) else choices
        assert spec["type"] != "choice" or spec["default"] in choices, key


def _cases(kind: str) -> list[tuple[str, object]]:
    return [(value, expected) for value, expected in C["units"][f"{kind}_cases"]]


@pytest.mark.parametrize("kind", ["size", "duration"])
def test_python_parses_the_contracts_cases(kind):
    parse = {"size": config.parse_size, "duration": config.parse_duration}[kind]
    got = {}
    for value, _ in _cases(kind):
        try:
            got[value] = parse(value)
        except config.ConfigError as exc:
            assert f"not a {kind}" in str(exc)
            got[value] = None
    assert got == dict(_cases(kind))
    assert all(type(v) is {"size": int, "duration": float}[kind] for v in got.values() if v is not None)


# ------------------------------------------------------------------ the Java sources name the contract's constants
def _java_sources() -> dict[str, str]:
    return {str(p.relative_to(JAVA)): p.read_text(encoding="utf-8") for p in sorted(JAVA.rglob("*.java"))}


def _literals_where_codes_and_states_are_used(text: str) -> set[str]:
    """String literals compared with ``.equals``, given as a JSON field's default, or passed as a WireException's
    code: where the JVM would spell a code or state on its own."""
    flat = re.sub(r"\s+", " ", re.sub(r"//[^\n]*", "", text))
    found = set(re.findall(r'"([a-z_]+)"\s*\.equals(?:IgnoreCase)?\(', flat))
    found |= set(re.findall(r'path\("(?:code|state)"\)\.asText\("([a-z_]+)"\)', flat))
    found |= set(re.findall(r'new WireException\([^;]*,\s*"([a-z_]+)"\)\s*;', flat))
    return found


def test_the_java_sources_spell_no_error_code_or_state_of_their_own():
    reserved = set(C["error_codes"].values()) | set(C["exchange_states"].values()) | \
        set(C["partition_states"].values()) | {"connection_lost"}
    spelled = {name: sorted(_literals_where_codes_and_states_are_used(text) & reserved)
               for name, text in _java_sources().items()}
    assert {name: found for name, found in spelled.items() if found} == {}, \
        "use org.sparkflow.exchange.contract.Contract's ErrorCode / ExchangeState / PartitionState"


def _spelled_settings(text: str) -> set[str]:
    """String literals that are an option key (any case) or the session prefix, and number literals that look like
    a default (a shift, a long, digits grouped by _): where a settings class would spell the contract on its own."""
    flat = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)
    keys = {k.lower() for k in C["options"]["keys"]} | {C["options"]["prefix"]}
    found = {lit for lit in re.findall(r'"([^"\\]*)"', flat) if lit.lower() in keys}
    found |= set(re.findall(r"\b\d+L?\s*<<\s*\d+|\b\d[\d_]*_\d+L?\b|\b\d{3,}L?\b", flat))
    return found


def test_the_settings_classes_spell_no_key_or_default_of_their_own():
    """WriteSettings, ReadSettings and StreamSettings take every key and default from the generated Contract."""
    for name in ("org/sparkflow/exchange/write/WriteSettings.java", "org/sparkflow/exchange/read/ReadSettings.java",
                 "org/sparkflow/exchange/stream/StreamSettings.java"):
        assert _spelled_settings((JAVA / name).read_text(encoding="utf-8")) == set(), name
    assert _spelled_settings('o.getOrDefault("buffersize", x); long n = 32L << 20; int t = 100_000_000;') == \
        {"buffersize", "32L << 20", "100_000_000"}


# the classes that read settings: they name every option key through the generated Contract.Option
SETTINGS_READERS = ("catalog/ExchangeCatalog.java", "discovery/Discovery.java", "format/FormatCatalog.java",
                    "format/PipelinedFormat.java", "format/PythonSource.java", "format/Route.java",
                    "stream/StreamSink.java", "stream/StreamTable.java", "wire/Tls.java")


def _spelled_keys(text: str) -> set[str]:
    """String literals that are an option key (any case), outside a JSON field read (``.path("..")``, ``.get("..")``
    on a state file or reply is a field of that document, not a setting)."""
    flat = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)
    flat = re.sub(r'\.(?:path|hasNonNull|has)\("[^"]*"\)', "", flat)
    keys = {k.lower() for k in C["options"]["keys"]} | {C["options"]["prefix"]}
    return {lit for lit in re.findall(r'"([^"\\]*)"', flat) if lit.lower() in keys}


def test_the_classes_that_read_settings_spell_no_option_key():
    for name in SETTINGS_READERS:
        assert _spelled_keys((JAVA / "org/sparkflow/exchange" / name).read_text(encoding="utf-8")) == set(), name
    assert _spelled_keys('settings.get("tls.caFile"); Set.of("readpartitions"); info.path("coordinator")') == \
        {"tls.caFile", "readpartitions"}


def test_the_source_scan_finds_a_spelled_code():
    """The scan above is not vacuous: each way of spelling a code is found."""
    assert _literals_where_codes_and_states_are_used('if ("no_exchange".equals(e.code())) {') == {"no_exchange"}
    assert _literals_where_codes_and_states_are_used('m.path("code").asText("released")') == {"released"}
    assert _literals_where_codes_and_states_are_used('throw new WireException("x " + y,\n  "protocol");') == {"protocol"}


# ------------------------------------------------------------------ the built jar agrees with the file
@pytest.fixture(scope="module")
def jvm(jar, tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("java is not on PATH")
    return compile_driver(jar, tmp_path_factory.mktemp("jvm-units"))


def test_pythons_compression_option_is_the_contracts():
    codecs = C["options"]["keys"]["compression"]
    assert config.COMPRESSIONS == tuple(codecs["choices"]) and config.COMPRESSIONS[0] == "none"
    assert config.ExchangeConfig().compression == codecs["default"] in config.COMPRESSIONS
    assert buffer.MIN_SAVING_PERCENT == C["compression"]["min_saving_percent"]
    assert buffer.RETRY_AFTER == C["compression"]["retry_after"]
    assert buffer.SKIP_MIN_BYTES == C["compression"]["skip_min_bytes"]
    assert buffer.ZSTD_LEVEL == C["compression"]["zstd_level"]
    assert buffer.compression_codec("zstd").compression_level == C["compression"]["zstd_level"]


def _expected_contract_class() -> dict:
    from sparkflow_exchange.build_plugin import java_name, json_header_fields

    def flags(group: dict) -> dict:
        out = {"ALL": list(group)}
        for member, props in group.items():
            for prop, on in props.items():
                out.setdefault(prop.upper(), [])
                if on:
                    out[prop.upper()].append(member)
        return out

    b, s, f, u = C["buffer"], C["spill_index"], C["frame"], C["units"]
    jvm = {k: spec for k, spec in C["options"]["keys"].items() if "jvm" in spec["languages"]}
    return {
        "Frame": {"MAGIC": f["magic"], "VERSION": f["version"], "PREFIX_SIZE": f["prefix_size"],
                  "MAX_FRAME": f["max_frame"]},
        "MessageType": C["message_types"],
        "DataHeaderSize": {name: contract.layout(fields).size for name, fields in C["data_headers"].items()},
        **{cls: {n.upper(): n for n in fields} for cls, fields in json_header_fields(C).items()},
        "ErrorCode": C["error_codes"],
        "ErrorClass": {"OF": {C["error_codes"][name]: cls for name, cls in C["error_classes"].items()}},
        "PartitionType": {**{n: n for n in C["partition_types"]}, **flags(C["partition_types"])},
        "Partitioner": {**{n.upper(): n for n in C["partitioners"]}, **flags(C["partitioners"])},
        "ExchangeState": C["exchange_states"],
        "PartitionState": C["partition_states"],
        "ExchangeKind": C["exchange_kinds"],
        "BufferKind": b["kinds"],
        "BufferFlag": b["flags"],
        "Buffer": {"BROADCAST_SUBPARTITION": b["broadcast_subpartition"], "TRAILER_SIZE": b["trailer_size"],
                   "END_COUNTS_SIZE": b["end_counts_size"]},
        "SpillIndex": {"MAGIC": s["magic"], "VERSION": s["version"], "ENTRY_SIZE": s["entry_size"]},
        "Units": {"SIZE_PATTERN": u["size_pattern"], "SIZE_SUFFIXES": u["size_suffixes"], "SIZE_MAX": u["size_max"],
                  "SIZE_HINT": u["size_hint"], "DURATION_PATTERN": u["duration_pattern"],
                  "DURATION_SUFFIXES": u["duration_suffixes"], "DURATION_HINT": u["duration_hint"]},
        "Option": {"PREFIX": C["options"]["prefix"], **{java_name(k): k for k in jvm}},
        "OptionDefault": {java_name(k): spec["default"] for k, spec in jvm.items()},
        "OptionChoices": {java_name(k): (list(C[spec["choices"][1:]]) if isinstance(spec["choices"], str)
                                         else spec["choices"]) for k, spec in jvm.items() if spec["type"] == "choice"},
        "Compression": {"DEFAULT": C["options"]["keys"]["compression"]["default"],
                        "CODECS": C["options"]["keys"]["compression"]["choices"]},
        "CompressionSaving": {"MIN_PERCENT": C["compression"]["min_saving_percent"],
                              "RETRY_AFTER": C["compression"]["retry_after"],
                              "SKIP_MIN_BYTES": C["compression"]["skip_min_bytes"]},
        "CompressionLevel": {"ZSTD": C["compression"]["zstd_level"]},
    }


def _frames_fields() -> list[str]:
    text = (JAVA / "org/sparkflow/exchange/wire/Frames.java").read_text(encoding="utf-8")
    return re.findall(r"public static final \w+ ([A-Z_]+) =", text)


def test_the_jars_constants_are_the_contracts(jvm):
    """The generated class holds the file's values, and every class that names a contract constant holds the same
    value: a literal written over one in Java fails here."""
    p = "org.sparkflow.exchange."
    b, s = C["buffer"], C["spill_index"]
    expected = {f"{p}wire.Frames#{name}": C["message_types"].get(name) for name in _frames_fields()}
    expected.update({f"{p}wire.Frames#MAGIC": C["frame"]["magic"], f"{p}wire.Frames#VERSION": C["frame"]["version"],
                     f"{p}wire.Frames#PREFIX_SIZE": C["frame"]["prefix_size"],
                     f"{p}wire.RpcConnection#MAX_FRAME": C["frame"]["max_frame"],
                     f"{p}read.SpillIndex#MAGIC": s["magic"], f"{p}read.SpillIndex#ENTRY": s["entry_size"],
                     f"{p}read.SpillIndex#DATA": b["kinds"]["DATA"],
                     f"{p}read.SpillIndex#END_OF_PARTITION": b["kinds"]["END_OF_PARTITION"],
                     f"{p}read.SpillIndex#MARKER": b["kinds"]["MARKER"],
                     f"{p}write.BufferEncoder#TRAILER": b["trailer_size"],
                     f"{p}read.BufferDecoder#TRAILER": b["trailer_size"],
                     f"{p}read.ProducerFile#END_COUNTS": b["end_counts_size"],
                     f"{p}read.CreditReceiver#HEADER": contract.layout(C["data_headers"]["BUFFER_RESPONSE"]).size,
                     f"{p}read.CreditReceiver#FLAG_SHARED": b["flags"]["SHARED"],
                     f"{p}write.RowRouter#BROADCAST": b["broadcast_subpartition"],
                     f"{p}write.WriteSettings#PARTITIONERS": [n for n, x in C["partitioners"].items() if x["jvm_write"]],
                     f"{p}write.WriteSettings#PARTITION_TYPES": list(C["partition_types"]),
                     f"{p}format.Route#READ_PARTITIONERS": sorted(n for n, x in C["partitioners"].items() if x["jvm_read"]),
                     f"{p}read.ReadSettings#READ_PARTITIONS": "readPartitions",
                     f"{p}read.ReadSettings#READ_PARTITIONS_DEFAULT": C["options"]["keys"]["readPartitions"]["default"],
                     f"{p}read.ReadSettings#READ_WHILE_WRITTEN": "readWhileWritten",
                     f"{p}read.ReadSettings#WHILE_WRITTEN_DEFAULT": C["options"]["keys"]["readWhileWritten"]["default"],
                     f"{p}read.ReadSettings#COMMIT_TIMEOUT": "commitTimeout",
                     f"{p}format.FormatCatalog#DECLARE_TIMEOUT": "declareTimeout",
                     f"{p}format.FormatCatalog#ENABLED_KEY": C["options"]["prefix"] + "jvmFormat",
                     f"{p}codec.Codecs#NAMES": C["options"]["keys"]["compression"]["choices"],
                     f"{p}codec.Codecs#DEFAULT": C["options"]["keys"]["compression"]["default"],
                     f"{p}codec.Codecs#ZSTD_LEVEL": C["compression"]["zstd_level"]})
    expected.update({f"{p}errors.ErrorCodes#{name}": code for name, code in C["error_codes"].items()})
    assert None not in expected.values(), "Frames names a constant the contract does not have"
    generated, used = jvm([{"op": "contract"}, {"op": "fields", "fields": sorted(expected)}])
    assert generated == {"contract": _expected_contract_class()}
    assert {name: value for name, value in used["fields"].items() if value != expected[name]} == {}


@pytest.mark.parametrize("kind", ["size", "duration"])
def test_the_jvm_parses_the_contracts_cases(jvm, kind):
    """The same cases through WriteSettings.parseSize / parseSeconds: the same values accepted with the same
    results (bit for bit), the same refused."""
    [answer] = jvm([{"op": "parse", "kind": kind, "values": [v for v, _ in _cases(kind)]}])
    got = {}
    for (value, _), result in zip(_cases(kind), answer["results"]):
        if isinstance(result, dict):
            assert f"not a {kind}: '{value}'" in result["error"]
            result = None
        got[value] = result
    assert got == dict(_cases(kind))


def _python_write(options: dict) -> dict:
    cfg = config.ExchangeConfig.load(options, spark_conf={})
    return {"partitioner": cfg.partitioner, "keys": list(cfg.keys), "numSubpartitions": cfg.num_subpartitions,
            "partitionType": str(cfg.partition_type), "bufferSize": cfg.buffer_size,
            "sortBufferSize": cfg.sort_buffer_size, "buffers": cfg.buffers_per_partition,
            "bufferTimeoutNanos": int(cfg.buffer_timeout * 1e9), "compression": cfg.compression,
            "compressionThread": C["options"]["keys"]["compressionThread"]["default"],  # the JVM writer's only
            "readers": list(cfg.readers)}


WRITE_OPTIONS = [
    {"keys": "a"},  # the defaults
    {"keys": "a, b", "BUFFERSIZE": "1mib", "sortBufferSize": "64 MB", "bufferTimeout": "250ms",
     "buffersPerPartition": "4", "compression": "ZSTD", "partitionType": "blocking", "numSubpartitions": "3"},
    {"partitioner": "broadcast", "bufferSize": "512k", "bufferTimeout": "1.5", "maxFrameSize": "1m",
     "readers": "bob, analysts"},
]
REFUSED_WRITE_OPTIONS = [
    ({"keys": "a", "bufferSize": "1.5m"}, "not a size"),
    ({"keys": "a", "bufferTimeout": "1d"}, "not a duration"),
    ({"keys": "a", "bufferSize": "1g"}, "must be at most half of maxFrameSize"),
    ({"keys": "a", "compression": "gzip"}, "unknown compression 'gzip'"),
]


def test_the_jvm_writer_reads_options_as_python_does(jvm):
    """The JVM writer's defaults are the contract's (Python's), and the same options give the same settings or are
    refused by both."""
    answers = jvm([{"op": "write_options", "options": o} for o in WRITE_OPTIONS] +
                  [{"op": "write_options", "options": o} for o, _ in REFUSED_WRITE_OPTIONS])
    settings = [a.get("settings", a) for a in answers[:len(WRITE_OPTIONS)]]
    assert settings == [_python_write(o) for o in WRITE_OPTIONS]
    keys = C["options"]["keys"]
    assert (settings[0]["bufferSize"], settings[0]["sortBufferSize"], settings[0]["buffers"],
            settings[0]["bufferTimeoutNanos"] / 1e9, settings[0]["compression"], settings[0]["partitioner"],
            settings[0]["partitionType"]) == \
        (keys["bufferSize"]["default"], keys["sortBufferSize"]["default"], keys["buffersPerPartition"]["default"],
         keys["bufferTimeout"]["default"], keys["compression"]["default"], keys["partitioner"]["default"],
         keys["partitionType"]["default"])
    for (options, reason), answer in zip(REFUSED_WRITE_OPTIONS, answers[len(WRITE_OPTIONS):]):
        assert reason in answer.get("error", ""), (options, answer)
        with pytest.raises(config.ConfigError, match=reason):
            config.ExchangeConfig.load(options, spark_conf={})
