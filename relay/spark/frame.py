"""Checks a DataFrame of outbox rows against the table and shapes it for the write.

Everything here fails before a row is written: a column that is missing, unknown, managed by
the relay or of the wrong type raises at once (no Spark job), and `check_values` finds the
first bad value (null, invalid JSON text, malformed id) in one Spark pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relay.spark.errors import OutboxColumnError
from relay.spark.ids import outbox_id
from relay.spark.typemap import json_invalid, pg_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

REQUIRED = ("exchange", "routing_key", "content")
JSON_COLUMNS = ("content", "options")
TEXT_COLUMNS = ("exchange", "routing_key", "ordering_key", "fairness_key", "id")
TIME_COLUMNS = ("available_at",)
#: Columns the relay fills and updates itself; a job never writes them.
MANAGED = ("seq", "created_at", "attempts", "last_error", "xact")

_UUID_RE = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
_SHOWN_CHARS = 80


@dataclass
class Prepared:
    """The DataFrame to write (columns in table names, JSON as text) and its value checks."""

    df: DataFrame
    #: Outbox columns written (the DataFrame may carry extra_columns besides).
    columns: list[str]
    #: (column, condition true for a bad row, what is wrong)
    checks: list[tuple[str, Column, str]] = field(default_factory=list)
    #: Staged-only sort columns that are not outbox columns: name -> PostgreSQL type.
    extra_columns: dict[str, str] = field(default_factory=dict)
    #: The merge's sort order after ordering_key (staged names).
    order_by: list[str] = field(default_factory=list)


def _type_name(dtype: object) -> str:
    simple = getattr(dtype, "simpleString", None)
    return simple() if callable(simple) else str(dtype)


def _check_names(df: DataFrame, table: str, table_columns: Mapping[str, str]) -> None:
    writable = [c for c in table_columns if c not in MANAGED]
    for col in REQUIRED:
        if col not in df.columns:
            raise OutboxColumnError(
                f"column {col!r} is required and missing (DataFrame has {df.columns}); "
                f"exchange and routing_key may also be given as write_outbox arguments"
            )
    for col in df.columns:
        if col in MANAGED:
            raise OutboxColumnError(f"column {col!r} is managed by the relay; drop it")
        if col not in table_columns:
            raise OutboxColumnError(
                f"unknown column {col!r}: {table} has the writable columns {writable}"
            )


def _shape_column(df: DataFrame, col: str, prepared: Prepared) -> DataFrame:
    """Cast or serialise one known column; register its value checks."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    dtype = df.schema[col].dataType
    nullable = df.schema[col].nullable
    c = F.col(col)
    if col in JSON_COLUMNS:
        if isinstance(dtype, T.StringType):
            prepared.checks.append((col, json_invalid(col), "is not valid JSON"))
        elif isinstance(dtype, T.StructType | T.MapType | T.ArrayType) or (
            type(dtype).__name__ == "VariantType"  # Spark 4
        ):
            df = df.withColumn(col, F.to_json(c))
        else:
            raise OutboxColumnError(
                f"column {col!r} has type {_type_name(dtype)}; expected a JSON string or a "
                "struct, map or array (serialised with to_json)"
            )
    elif col in TEXT_COLUMNS:
        if not isinstance(dtype, T.StringType | T.VarcharType | T.CharType):
            raise OutboxColumnError(
                f"column {col!r} has type {_type_name(dtype)}; expected string"
            )
        if col == "id":
            prepared.checks.append((col, ~c.rlike(_UUID_RE) | c.isNull(), "is not a UUID"))
    elif col in TIME_COLUMNS and not isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        raise OutboxColumnError(
            f"column {col!r} has type {_type_name(dtype)}; expected timestamp"
        )
    if col in REQUIRED and nullable:
        prepared.checks.append((col, c.isNull(), "is null"))
    return df


def _key_id(df: DataFrame, key: Sequence[str]) -> DataFrame:
    """Add `id = outbox_id(key columns)`; the key must name existing columns, and no `id`."""
    missing = [k for k in key if k not in df.columns]
    if missing:
        raise OutboxColumnError(
            f"key column(s) {missing} not in the DataFrame (it has {df.columns})"
        )
    if "id" in df.columns:
        raise OutboxColumnError(
            "the DataFrame has an 'id' column and key= was given: use one or the other"
        )
    return df.withColumn("id", outbox_id(*key))


def _order_columns(
    df: DataFrame, order_by: Sequence[str], table_columns: Mapping[str, str],
    prepared: Prepared,
) -> DataFrame:
    """Name the merge's sort columns; a non-outbox column is staged as `relay_order_<i>`."""
    for i, col in enumerate(order_by):
        if col not in df.columns:
            raise OutboxColumnError(
                f"order_by column {col!r} not in the DataFrame (it has {df.columns})"
            )
        if col in table_columns and col not in MANAGED:
            prepared.order_by.append(col)
            continue
        name = f"relay_order_{i}"
        prepared.extra_columns[name] = pg_type(df.schema[col].dataType, col)
        prepared.order_by.append(name)
        df = df.withColumn(name, df[col])
    return df


def prepare(
    df: DataFrame,
    *,
    table: str,
    table_columns: Mapping[str, str],
    exchange: str | None = None,
    routing_key: str | None = None,
    fairness_key: str | None = None,
    key: Sequence[str] | None = None,
    ids: str | None = None,
    order_by: Sequence[str] = (),
    idempotent: bool = True,
) -> Prepared:
    """Validate column names and types (no Spark job) and return the DataFrame to write.

    Ids come from `key` (outbox_id of those columns) or an `id` column: both are the same
    whatever order or partition a row is computed in, so a retried task, a recomputed stage
    or a re-run writes the same ids. `ids="random"` lets the table draw them (not retry-safe).
    """
    from pyspark.sql import functions as F

    if ids not in (None, "random"):
        raise OutboxColumnError(f"ids={ids!r}: the only accepted value is 'random'")
    for name, value in (("exchange", exchange), ("routing_key", routing_key),
                        ("fairness_key", fairness_key)):
        if value is None:
            continue
        if name in df.columns:
            raise OutboxColumnError(
                f"column {name!r} is given twice: as a DataFrame column and as an argument"
            )
        df = df.withColumn(name, F.lit(value))
    passthrough = {c for c in (*(key or ()), *order_by)
                   if c not in table_columns or c in MANAGED}
    outbox = [c for c in df.columns if c not in passthrough]
    _check_names(df.select(*outbox), table, table_columns)
    if ids == "random" and (key or "id" in df.columns):
        raise OutboxColumnError("ids='random' cannot be combined with key= or an 'id' column")
    if key:
        df = _key_id(df, key)
        outbox = [*outbox, "id"]
    elif "id" not in df.columns and idempotent and ids != "random":
        raise OutboxColumnError(
            "no ids: give key=[columns of the event's natural key] (id = outbox_id(key)) or an "
            "'id' column; ids='random' opts out (a retried task or a re-run then duplicates)"
        )
    prepared = Prepared(df=df, columns=outbox)
    df = _order_columns(df, order_by, table_columns, prepared)
    df = df.select(*outbox, *prepared.extra_columns)
    for col in outbox:
        df = _shape_column(df, col, prepared)
    prepared.df = df
    return prepared


def check_values(prepared: Prepared) -> None:
    """One Spark pass: raise OutboxColumnError for the first bad value found, if any."""
    from functools import reduce

    from pyspark.sql import functions as F

    if not prepared.checks:
        return
    flags = [cond.alias(f"_bad_{i}") for i, (_, cond, _) in enumerate(prepared.checks)]
    any_bad = reduce(lambda a, b: a | b, [cond for _, cond, _ in prepared.checks])
    watched = sorted({col for col, _, _ in prepared.checks})
    rows = prepared.df.where(any_bad).select(*[F.col(c) for c in watched], *flags).limit(1)
    found = rows.collect()
    if not found:
        return
    row = found[0]
    for i, (col, _, what) in enumerate(prepared.checks):
        if row[f"_bad_{i}"]:
            value = row[col]
            shown = repr(value if value is None or len(value) <= _SHOWN_CHARS
                         else value[:_SHOWN_CHARS] + "...")
            raise OutboxColumnError(f"column {col!r} {what}: first offending value {shown}")
