"""The contract between the Python package and the JVM plugin, read from ``contract.json`` beside this file.

Frame and message numbers, error codes and the class of each code's meaning, partition types, partitioners and their properties, exchange and
partition states, buffer kinds and flags, the buffer trailer and the spill index layout, how sizes and durations
are read (with cases both parsers run), and every option key with its type, unit, default and where it applies:
what both languages must agree on, written once as data. The JVM plugin's ``org.sparkflow.exchange.contract.Contract`` is generated
from the file when the jar is built (``build_plugin.py``); ``tests/test_contract.py`` checks the Python
definitions and the built jar against it. Standard library only.
"""
from __future__ import annotations

import json
import struct
from functools import cache
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().parent / "contract.json"

# field types of the layouts, as struct codes (big endian)
_CODES = {"i8": "b", "u8": "B", "i32": "i", "u32": "I", "i64": "q", "u64": "Q"}


@cache
def load() -> dict[str, Any]:
    """The contract as a dict (read once)."""
    return json.loads(PATH.read_text(encoding="utf-8"))


def layout(fields: list[list[str]]) -> struct.Struct:
    """A binary layout of the contract (``[[name, type], ...]``) as the big-endian struct it describes."""
    try:
        return struct.Struct(">" + "".join(_CODES[kind] for _, kind in fields))
    except KeyError as exc:
        raise ValueError(f"contract layout has an unknown field type {exc.args[0]!r}; known: {', '.join(_CODES)}") from None
