"""Where a Spark write goes: the resolved database target and its driver-side connection."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relay.dsn import redact
from relay.errors import DatabaseError, SchemaError
from relay.pg.queries import TableNames
from relay.spark.config import load_settings
from relay.spark.dsn import JdbcTarget, conninfo, jdbc_target_of, libpq_params
from relay.spark.sql import SparkSql

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame

_MESSAGE_CHARS = 600


@dataclass(frozen=True)
class Target:
    """The outbox table and database of one write, every libpq keyword resolved on the driver."""

    dsn: str | None = field(repr=False)
    #: Every libpq keyword resolved on the driver (PG* variables, defaults): what executors get.
    params: dict[str, str] = field(repr=False)
    jdbc: JdbcTarget
    names: TableNames
    sql: SparkSql

    @property
    def table(self) -> str:
        return self.names.placeholders()["table"]

    @property
    def conninfo(self) -> str:
        return conninfo(self.params)


def explain(exc: BaseException, target: Target) -> str:
    """A short, password-free reason from a Spark/JDBC/psycopg error."""
    text = str(exc)
    match = re.search(r"(?:PSQLException|SQLException|psycopg\.\w+\.\w+): (.+)", text)
    reason = match.group(1) if match else (text.strip().splitlines() or [type(exc).__name__])[0]
    if target.jdbc.password:
        reason = reason.replace(target.jdbc.password, "***")
    return reason[:_MESSAGE_CHARS]


@contextlib.contextmanager
def connect(target: Target) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit psycopg connection of the driver; a failure is a DatabaseError, redacted."""
    import psycopg

    try:
        conn = psycopg.connect(
            target.conninfo, autocommit=True, application_name="outbox-relay-spark"
        )
    except psycopg.Error as exc:
        raise DatabaseError(
            f"cannot connect to {redact(target.dsn)}: {explain(exc, target)}"
        ) from None
    with conn:
        yield conn


def outbox_columns(conn: psycopg.Connection[Any], target: Target) -> tuple[str, dict[str, str]]:
    """The outbox table's schema and its columns with their catalog types."""
    import psycopg

    try:
        schema_row = conn.execute(target.sql.render("spark_table_schema")).fetchone()
        rows = conn.execute(target.sql.render("spark_table_columns")).fetchall()
    except psycopg.errors.UndefinedTable:
        raise SchemaError(
            f"the outbox table {target.table} does not exist: run `relay migrate`"
        ) from None
    assert schema_row is not None
    return str(schema_row[0]), {str(name): str(kind) for name, kind in rows}


def jdbc_append(
    df: DataFrame, target: Target, dbtable: str, batch_size: int, max_connections: int
) -> None:
    """df.write.jdbc append into `dbtable`, at most `max_connections` partitions at once."""
    # numPartitions: Spark's JDBC writer coalesces to this many partitions (connections).
    props = target.jdbc.properties() | {
        "batchsize": str(batch_size), "numPartitions": str(max_connections)
    }
    df.write.jdbc(target.jdbc.url, dbtable, mode="append", properties=props)


def resolve(dsn: str | None, table: str | None) -> Target:
    """The target of `dsn` (default RELAY_PG_DSN, else PG*) and `table` (default RELAY_TABLE)."""
    settings = load_settings(table=table) if table else load_settings()
    dsn = dsn if dsn is not None else settings.pg_dsn
    names = TableNames(settings.table_schema, settings.table_name, settings.notify_channel)
    params = libpq_params(dsn)  # a bad DSN: DsnError (a ConfigError) naming the problem
    return Target(dsn=dsn, params=params, jdbc=jdbc_target_of(params), names=names,
                   sql=SparkSql(names))
