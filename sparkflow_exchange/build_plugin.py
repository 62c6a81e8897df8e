"""Build the Spark plugin jar with javac against the jars inside the pyspark wheel (no Maven).

One builder for every route to the jar: the package build (``setup.py`` puts the jar in the wheel),
``jvm-stub/build.py`` (a source checkout) and ``python -m sparkflow_exchange.build_plugin`` (an
installed package whose wheel was built without a JDK: the wheel carries the Java sources).
Standard library only: ``setup.py`` loads this file by path, before the package is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

JAR_NAME = "sparkflow-exchange-plugin.jar"
PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_SOURCES = PACKAGE_DIR / "jvm_src"  # the Java sources as the wheel carries them
CHECKOUT_SOURCES = PACKAGE_DIR.parent / "jvm-stub" / "src" / "main" / "java"  # a source checkout
DEFAULT_JAR = PACKAGE_DIR / "jars" / JAR_NAME
CONTRACT = PACKAGE_DIR / "contract.json"  # what Python and the jar agree on; the jar's Contract class is made from it
CONTRACT_CLASS = "org/sparkflow/exchange/contract/Contract.java"
MANIFEST = ("Manifest-Version: 1.0\r\n"
            "Created-By: sparkflow-exchange build_plugin\r\n"
            "Implementation-Title: sparkflow-exchange-plugin\r\n"
            "\r\n")
# Service registrations written into the jar when their class was compiled: Spark's DataSourceRegister makes
# format("pipelined") the JVM provider's (org.sparkflow.exchange.format.PipelinedFormat) where the jar is loaded.
SERVICES = {"META-INF/services/org.apache.spark.sql.sources.DataSourceRegister":
            "org.sparkflow.exchange.format.PipelinedFormat"}


class BuildError(RuntimeError):
    """The jar cannot be built here; the message says what is missing."""


def default_sources() -> Path:
    """The Java sources: the checkout's jvm-stub/ when there is one, else the copy inside the package."""
    for root in (CHECKOUT_SOURCES, PACKAGED_SOURCES):
        if any(root.rglob("*.java")):
            return root
    raise BuildError(f"no Java sources under {CHECKOUT_SOURCES} or {PACKAGED_SOURCES}")


def spark_jars() -> list[Path]:
    """The jars to compile against: pyspark's own (``<pyspark>/jars``), else ``$SPARK_HOME/jars``."""
    candidates = []
    try:
        import pyspark

        candidates.append(Path(pyspark.__file__).parent / "jars")
    except ImportError:
        pass
    if os.environ.get("SPARK_HOME"):
        candidates.append(Path(os.environ["SPARK_HOME"]) / "jars")
    for directory in candidates:
        jars = sorted(directory.glob("*.jar"))
        if jars:
            return jars
    raise BuildError(f"no Spark jars to compile against: pyspark is not importable by {sys.executable} "
                     "and $SPARK_HOME/jars is not set or empty")


_SIZES = {"i8": 1, "u8": 1, "i32": 4, "u32": 4, "i64": 8, "u64": 8}


def _size(fields: list[list[str]]) -> int:
    return sum(_SIZES[kind] for _, kind in fields)


def _strings(name: str, values: dict[str, str], lists: dict[str, list[str]] | None = None, *,
             extendable: bool = False) -> list[str]:
    """A nested class of String constants, and List<String> constants of some of their values.

    ``extendable``: a class other classes may extend to name its constants as their own (``ErrorCodes.X``)."""
    lines = ([f"    public static class {name} {{", f"        protected {name}() {{}}"] if extendable else
             [f"    public static final class {name} {{", f"        private {name}() {{}}"])
    lines += [f"        public static final String {key} = {json.dumps(value)};" for key, value in values.items()]
    for list_name, members in (lists or {}).items():
        lines.append(f"        public static final List<String> {list_name} = List.of({', '.join(map(json.dumps, members))});")
    return lines + ["    }"]


def _class_of(codes: dict[str, str], classes: dict[str, str]) -> list[str]:
    """``ErrorClass.OF``: code -> the class of its meaning (a code not listed is a plain ServiceError)."""
    unknown = sorted(set(classes) - set(codes))
    if unknown:
        raise KeyError(f"error_classes names codes that error_codes lacks: {unknown}")
    entries = ",\n".join(f"                Map.entry(ErrorCode.{name}, {json.dumps(cls)})" for name, cls in classes.items())
    return ["    public static final class ErrorClass {", "        private ErrorClass() {}",
            f"        public static final Map<String, String> OF = Map.ofEntries(\n{entries});", "    }"]


def _ints(name: str, values: dict[str, int]) -> list[str]:
    lines = [f"    public static final class {name} {{", f"        private {name}() {{}}"]
    lines += [f"        public static final int {key} = {int(value)};" for key, value in values.items()]
    return lines + ["    }"]


def java_name(key: str) -> str:
    """The Java constant of an option key: ``bufferSize`` -> ``BUFFER_SIZE``, ``tls.caFile`` -> ``TLS_CA_FILE``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).replace(".", "_").upper()


def _java_value(spec: dict) -> tuple[str, str]:
    """The Java type and literal of an option's default: sizes in bytes (long), durations in seconds (double)."""
    kind, value = spec["type"], spec["default"]
    if kind == "list":
        return "List<String>", f"List.of({', '.join(map(json.dumps, value))})"
    if value is None:
        return {"int": "Integer", "size": "Long", "duration": "Double", "float": "Double", "bool": "Boolean"}.get(
            kind, "String"), "null"
    if kind == "bool":
        return "boolean", "true" if value else "false"
    if kind == "int":
        return "int", str(int(value))
    if kind == "size":
        return "long", f"{int(value)}L"
    if kind in ("duration", "float"):
        return "double", repr(float(value))
    return "String", json.dumps(value)


def _options(contract: dict) -> list[str]:
    """Contract.Option (the keys the JVM reads), Contract.OptionDefault (their defaults) and Contract.OptionChoices."""
    jvm = {key: spec for key, spec in contract["options"]["keys"].items() if "jvm" in spec["languages"]}
    out = _strings("Option", {"PREFIX": contract["options"]["prefix"], **{java_name(key): key for key in jvm}})
    out += ["    public static final class OptionDefault {", "        private OptionDefault() {}"]
    for key, spec in jvm.items():
        kind, literal = _java_value(spec)
        out.append(f"        public static final {kind} {java_name(key)} = {literal};")
    out += ["    }", "    public static final class OptionChoices {", "        private OptionChoices() {}"]
    for key, spec in jvm.items():
        if spec["type"] == "choice":
            choices = spec["choices"]
            choices = list(contract[choices[1:]]) if isinstance(choices, str) else choices
            out.append(f"        public static final List<String> {java_name(key)} = "
                       f"List.of({', '.join(map(json.dumps, choices))});")
    return out + ["    }"]


def _units(units: dict) -> list[str]:
    """Contract.Units: how sizes and durations are read (patterns, suffixes, bounds, the refusals' hint)."""
    sizes = ", ".join(f"Map.entry({json.dumps(k)}, {int(v)}L)" for k, v in units["size_suffixes"].items())
    times = ", ".join(f"Map.entry({json.dumps(k)}, {float(v)!r})" for k, v in units["duration_suffixes"].items())
    return ["    public static final class Units {", "        private Units() {}",
            f"        public static final String SIZE_PATTERN = {json.dumps(units['size_pattern'])};",
            f"        public static final Map<String, Long> SIZE_SUFFIXES = Map.ofEntries({sizes});",
            f"        public static final long SIZE_MAX = {int(units['size_max'])}L;",
            f"        public static final String SIZE_HINT = {json.dumps(units['size_hint'])};",
            f"        public static final String DURATION_PATTERN = {json.dumps(units['duration_pattern'])};",
            f"        public static final Map<String, Double> DURATION_SUFFIXES = Map.ofEntries({times});",
            f"        public static final String DURATION_HINT = {json.dumps(units['duration_hint'])};",
            "    }"]


def json_header_fields(contract: dict) -> dict[str, list[str]]:
    """The Java class of each JSON header's field names (``PARTITION_REQUEST`` -> ``PartitionRequestField``)."""
    return {"".join(w.capitalize() for w in message.split("_")) + "Field": [name for name, _ in fields]
            for message, fields in contract["json_headers"].items() if message != "about"}


def contract_java(contract: dict) -> str:
    """The Java source of ``org.sparkflow.exchange.contract.Contract``: the contract's constants, made at build time."""
    frame, buffer, spill = contract["frame"], contract["buffer"], contract["spill_index"]
    kinds = {"PARTITION_TYPES": contract["partition_types"], "PARTITIONERS": contract["partitioners"]}
    props: dict[str, dict[str, list[str]]] = {}
    for group, members in kinds.items():
        props[group] = {"ALL": list(members)}
        for member, flags in members.items():
            for flag, on in flags.items():
                props[group].setdefault(flag.upper(), [])
                if on:
                    props[group][flag.upper()].append(member)
    out = ["package org.sparkflow.exchange.contract;", "", "import java.util.List;", "import java.util.Map;", "",
           "/**",
           " * What the JVM plugin and the Python package agree on, generated from {@code sparkflow_exchange/contract.json}",
           " * by {@code sparkflow_exchange/build_plugin.py} when the jar is built. Do not edit: change the contract file.",
           " */",
           "public final class Contract {",
           "    private Contract() {}",
           "    public static final class Frame {",
           "        private Frame() {}",
           f"        public static final int MAGIC = {frame['magic']};",
           f"        public static final byte VERSION = {frame['version']};",
           f"        public static final int PREFIX_SIZE = {_size(frame['prefix'])};",
           f"        public static final int MAX_FRAME = {frame['max_frame']};",
           "    }"]
    out += _ints("MessageType", contract["message_types"])
    out += _ints("DataHeaderSize", {name: _size(fields) for name, fields in contract["data_headers"].items()})
    for message, fields in json_header_fields(contract).items():
        out += _strings(message, {name.upper(): name for name in fields})
    out += _strings("ErrorCode", contract["error_codes"], extendable=True)  # errors.ErrorCodes extends it
    out += _class_of(contract["error_codes"], contract["error_classes"])
    out += _strings("PartitionType", {name: name for name in contract["partition_types"]}, props["PARTITION_TYPES"])
    out += _strings("Partitioner", {name.upper(): name for name in contract["partitioners"]}, props["PARTITIONERS"])
    out += _strings("ExchangeState", contract["exchange_states"])
    out += _strings("PartitionState", contract["partition_states"])
    out += _strings("ExchangeKind", contract["exchange_kinds"])
    out += _ints("BufferKind", buffer["kinds"])
    out += _ints("BufferFlag", buffer["flags"])
    out += _ints("Buffer", {"BROADCAST_SUBPARTITION": buffer["broadcast_subpartition"],
                            "TRAILER_SIZE": _size(buffer["trailer"]), "END_COUNTS_SIZE": _size(buffer["end_counts"])})
    codecs = contract["options"]["keys"]["compression"]
    out += _strings("Compression", {"DEFAULT": codecs["default"]}, {"CODECS": codecs["choices"]})
    out += _ints("CompressionSaving", {"MIN_PERCENT": contract["compression"]["min_saving_percent"],
                                       "RETRY_AFTER": contract["compression"]["retry_after"],
                                       "SKIP_MIN_BYTES": contract["compression"]["skip_min_bytes"]})
    out += _ints("CompressionLevel", {"ZSTD": contract["compression"]["zstd_level"]})
    out += ["    public static final class SpillIndex {", "        private SpillIndex() {}",
            f"        public static final String MAGIC = {json.dumps(spill['magic'])};",
            f"        public static final int VERSION = {int(spill['version'])};",
            f"        public static final int ENTRY_SIZE = {_size(spill['entry'])};", "    }"]
    out += _units(contract["units"])
    out += _options(contract)
    return "\n".join(out + ["}", ""])


def generate_contract(root: Path, contract: Path = CONTRACT) -> Path:
    """Write the generated ``Contract.java`` under ``root``; a clear error if the contract file is missing or bad."""
    try:
        text = contract_java(json.loads(contract.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise BuildError(f"the contract file {contract} is missing; the jar's constants are made from it") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BuildError(f"the contract file {contract} is not a valid contract: {exc!r}") from None
    target = root / CONTRACT_CLASS
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def up_to_date(jar: Path, sources: Path) -> bool:
    inputs = [*sources.rglob("*.java"), Path(__file__).resolve(), *([CONTRACT] if CONTRACT.exists() else [])]
    return jar.exists() and all(jar.stat().st_mtime_ns > s.stat().st_mtime_ns for s in inputs)


def build(jar: Path = DEFAULT_JAR, sources: Path | None = None, *, force: bool = False) -> str:
    """Compile ``sources`` into ``jar`` (skipped when it is newer than every source); returns what it did."""
    sources = sources or default_sources()
    java_files = sorted(sources.rglob("*.java"))
    if not java_files:
        raise BuildError(f"no Java sources under {sources}")
    if not force and up_to_date(jar, sources):
        return f"plugin jar up to date, not rebuilt: {jar}"
    javac = shutil.which("javac")
    if javac is None:
        raise BuildError("javac (JDK 17 or newer) is not on PATH; cannot build the Spark plugin jar")
    classpath = os.pathsep.join(map(str, spark_jars()))
    with tempfile.TemporaryDirectory(prefix="sparkflow-jvm-stub-") as out, \
            tempfile.TemporaryDirectory(prefix="sparkflow-jvm-gen-") as generated:
        java_files = [*java_files, generate_contract(Path(generated))]
        # -XDstringConcat=inline: a string concatenation compiles to a StringBuilder, not to an invokedynamic
        # call site whose first run builds its method handles (class spinning and its compilation): a JVM's first
        # write ran dozens of those sites
        proc = subprocess.run([javac, "--release", "17", "-nowarn", "-XDstringConcat=inline", "-encoding", "UTF-8",
                               "-cp", classpath, "-d", out, *map(str, java_files)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"javac failed (exit {proc.returncode}); the jar was not written:\n"
                             f"{(proc.stdout + proc.stderr)[-4000:]}")
        classes = sorted(Path(out).rglob("*.class"))
        jar.parent.mkdir(parents=True, exist_ok=True)
        tmp = jar.with_name(f"{jar.name}.{os.getpid()}.tmp")
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
                archive.writestr("META-INF/MANIFEST.MF", MANIFEST)
                for cls in classes:
                    archive.write(cls, cls.relative_to(out).as_posix())
                for entry, provider in SERVICES.items():
                    if (Path(out) / (provider.replace(".", "/") + ".class")).exists():
                        archive.writestr(entry, provider + "\n")
            tmp.replace(jar)
        finally:
            tmp.unlink(missing_ok=True)
    return f"built {jar} ({len(classes)} classes from {len(java_files)} sources)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkflow_exchange.build_plugin", description=__doc__)
    parser.add_argument("--output", type=Path, default=DEFAULT_JAR, help=f"where to write the jar (default {DEFAULT_JAR})")
    parser.add_argument("--sources", type=Path, help="root of the Java sources (default: jvm-stub/ or the packaged copy)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the jar is up to date")
    args = parser.parse_args(argv)
    try:
        print(build(args.output, args.sources, force=args.force))
    except (BuildError, OSError) as exc:
        print(f"sparkflow_exchange.build_plugin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
