"""Spark type and version differences the writer needs (Spark 3.5 and 4.x)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relay.spark.errors import OutboxColumnError

if TYPE_CHECKING:
    from pyspark.sql import Column

# Spark SQL simple type name -> the PostgreSQL column type a staged sort column gets.
_PG_TYPES = {
    "tinyint": "smallint",
    "smallint": "smallint",
    "int": "integer",
    "bigint": "bigint",
    "float": "real",
    "double": "double precision",
    "boolean": "boolean",
    "string": "text",
    "date": "date",
    "timestamp": "timestamptz",
    "timestamp_ntz": "timestamp",
}


def pg_type(dtype: object, column: str) -> str:
    """The PostgreSQL type for a Spark column used only to sort the merge (order_by)."""
    simple = getattr(dtype, "simpleString", None)
    name = simple() if callable(simple) else str(dtype)
    if name.startswith("decimal"):
        return "numeric"
    if name.startswith(("varchar", "char")):
        return "text"
    if name not in _PG_TYPES:
        raise OutboxColumnError(
            f"order_by column {column!r} has type {name}; expected a number, string, boolean, "
            "date or timestamp"
        )
    return _PG_TYPES[name]


def json_invalid(col: str) -> Column:
    """True for a non-null string that is not JSON text.

    Spark 4 has try_parse_json; Spark 3.5 asks get_json_object for the whole document, which
    is null for invalid text and for the JSON literal null (told apart by its text).
    """
    from pyspark.sql import functions as F

    c = F.col(col)
    if hasattr(F, "try_parse_json"):
        return c.isNotNull() & F.expr(f"try_parse_json(`{col}`)").isNull()
    parsed = F.expr(f"get_json_object(`{col}`, '$')")
    return c.isNotNull() & parsed.isNull() & (F.trim(c) != F.lit("null"))
