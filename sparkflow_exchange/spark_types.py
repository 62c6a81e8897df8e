"""Arrow schemas as Spark users read them: ``bigint``, ``decimal(2,1)``, DDL strings.

Messages and summaries meant for Spark users name Spark's types, not Arrow's (``int64``,
``decimal128(2, 1)``). pyspark's own converter is used when pyspark is importable; a service or an
out-of-Spark client without it falls back to Arrow's names.
"""
from __future__ import annotations

import re

import pyarrow as pa

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def type_name(arrow_type: pa.DataType) -> str:
    """Spark's name of ``arrow_type`` (``bigint``, ``decimal(2,1)``, ``array<string>``), else Arrow's."""
    try:
        from pyspark.sql.pandas.types import from_arrow_type

        return from_arrow_type(arrow_type).simpleString()
    except Exception:  # noqa: BLE001 - no pyspark here, or a type Spark has no counterpart for
        return str(arrow_type)


def _quoted(name: str) -> str:
    return name if _PLAIN_NAME.match(name) else "`" + name.replace("`", "``") + "`"


def schema_ddl(schema: pa.Schema) -> str:
    """A Spark DDL string of ``schema`` (``id bigint NOT NULL, `a b` string``), as ``StructType.fromDDL`` and
    ``spark.read.schema(...)`` take it."""
    return ", ".join(f"{_quoted(f.name)} {type_name(f.type)}" + ("" if f.nullable else " NOT NULL") for f in schema)


def schema_text(schema: pa.Schema) -> str:
    """``schema`` for a message: its DDL in parentheses."""
    return f"({schema_ddl(schema)})"
