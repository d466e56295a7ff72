"""Checks a DataFrame of outbox rows against the table and shapes it for the write.

Everything here fails before a row is written: a column that is missing, unknown, managed by
the relay or of the wrong type raises at once (no Spark job), and `check_values` finds the
first bad value (null, invalid JSON text, malformed id) in one Spark pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from relay.spark.errors import OutboxColumnError
from relay.spark.ids import outbox_id

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

REQUIRED = ("exchange", "routing_key", "content")
JSON_COLUMNS = ("content", "options")
TEXT_COLUMNS = ("exchange", "routing_key", "ordering_key", "id")
TIME_COLUMNS = ("available_at",)
#: Columns the relay fills and updates itself; a job never writes them.
MANAGED = ("seq", "created_at", "attempts", "last_error")

_UUID_RE = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"
_SHOWN_CHARS = 80


@dataclass
class Prepared:
    """The DataFrame to write (columns in table names, JSON as text) and its value checks."""

    df: DataFrame
    columns: list[str]
    #: (column, condition true for a bad row, what is wrong)
    checks: list[tuple[str, Column, str]] = field(default_factory=list)


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
            prepared.checks.append(
                (col, c.isNotNull() & F.expr(f"try_parse_json(`{col}`)").isNull(),
                 "is not valid JSON")
            )
        elif isinstance(dtype, T.StructType | T.MapType | T.ArrayType | T.VariantType):
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


def prepare(
    df: DataFrame,
    *,
    table: str,
    table_columns: Mapping[str, str],
    exchange: str | None = None,
    routing_key: str | None = None,
    num_partitions: int | None = None,
    write_token: str,
) -> Prepared:
    """Validate column names and types (no Spark job) and return the DataFrame to write.

    Without an `id` column, ids are derived from `write_token` and each row's position in its
    partition: a retried task writes the same ids again, which ON CONFLICT then skips.
    """
    from pyspark.sql import functions as F

    for name, value in (("exchange", exchange), ("routing_key", routing_key)):
        if value is None:
            continue
        if name in df.columns:
            raise OutboxColumnError(
                f"column {name!r} is given twice: as a DataFrame column and as an argument"
            )
        df = df.withColumn(name, F.lit(value))
    _check_names(df, table, table_columns)
    prepared = Prepared(df=df, columns=[])
    for col in df.columns:
        df = _shape_column(df, col, prepared)
    if num_partitions is not None:
        current = df.rdd.getNumPartitions()
        df = df.coalesce(num_partitions) if current > num_partitions else (
            df.repartition(num_partitions) if current < num_partitions else df
        )
    if "id" not in df.columns:
        # After any repartition, so the position is that of the partitions actually written.
        df = df.withColumn("id", outbox_id(F.lit(write_token), F.monotonically_increasing_id()))
    prepared.df = df
    prepared.columns = list(df.columns)
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
