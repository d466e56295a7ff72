"""`write_outbox`: a DataFrame of outbox rows into the relay's table, in one of three modes."""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import structlog

from relay.errors import DatabaseError, RelayError, SchemaError
from relay.pg.queries import TableNames, quote_ident
from relay.settings import redact_url
from relay.spark.config import load_settings
from relay.spark.copy import CopyPartition
from relay.spark.dsn import JdbcTarget, jdbc_target
from relay.spark.errors import SparkWriteError
from relay.spark.frame import Prepared, check_values, prepare
from relay.spark.sql import SparkSql

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame

log = structlog.get_logger("relay.spark")

_MESSAGE_CHARS = 600


class WriteMode(StrEnum):
    """How rows reach the outbox table."""

    STAGED = "staged"  # staging table + one merge: atomic, idempotent, one wake-up per job
    COPY = "copy"  # COPY + merge per partition: idempotent under task retry, not atomic
    APPEND = "append"  # plain JDBC INSERT: fastest, neither atomic nor idempotent


@dataclass(frozen=True)
class WriteResult:
    """What a write did. `rows`/`inserted` are None in append mode (not counted)."""

    mode: WriteMode
    rows: int | None
    inserted: int | None
    elapsed_s: float

    @property
    def skipped(self) -> int | None:
        """Rows whose id was already in the outbox (or its archive)."""
        if self.rows is None or self.inserted is None:
            return None
        return self.rows - self.inserted


@dataclass(frozen=True)
class _Target:
    dsn: str | None
    jdbc: JdbcTarget
    names: TableNames
    sql: SparkSql

    @property
    def table(self) -> str:
        return self.names.placeholders()["table"]


def _explain(exc: BaseException, target: _Target) -> str:
    """A short, password-free reason from a Spark/JDBC/psycopg error."""
    text = str(exc)
    match = re.search(r"(?:PSQLException|SQLException|psycopg\.\w+\.\w+): (.+)", text)
    reason = match.group(1) if match else (text.strip().splitlines() or [type(exc).__name__])[0]
    if target.jdbc.password:
        reason = reason.replace(target.jdbc.password, "***")
    return reason[:_MESSAGE_CHARS]


@contextlib.contextmanager
def _connect(target: _Target) -> Iterator[psycopg.Connection[Any]]:
    import psycopg

    try:
        conn = psycopg.connect(
            target.dsn or "", autocommit=True, application_name="outbox-relay-spark"
        )
    except psycopg.Error as exc:
        raise DatabaseError(
            f"cannot connect to {redact_url(target.dsn)}: {_explain(exc, target)}"
        ) from None
    with conn:
        yield conn


def _table_columns(conn: psycopg.Connection[Any], target: _Target) -> tuple[str, dict[str, str]]:
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


def _jdbc_append(df: DataFrame, target: _Target, dbtable: str, batch_size: int) -> None:
    props = target.jdbc.properties() | {"batchsize": str(batch_size)}
    df.write.jdbc(target.jdbc.url, dbtable, mode="append", properties=props)


def cleanup_staging(dsn: str | None = None, table: str | None = None) -> list[str]:
    """Drop staging tables left by crashed jobs (whose driver no longer holds their lock).

    Runs at the start of every staged write; also `python -m relay.spark cleanup`.
    """
    target = _resolve(dsn, table)
    return _cleanup(target)


def _cleanup(target: _Target) -> list[str]:
    with _connect(target) as conn:
        stale = [str(r[0]) for r in conn.execute(target.sql.render("spark_stale_stages"))]
        for stage in stale:
            conn.execute(target.sql.render("spark_stage_drop", stage=stage))
            log.warning("spark_stale_stage_dropped", stage=stage)
    return stale


def _write_staged(
    prepared: Prepared, conn: psycopg.Connection[Any], target: _Target, *, schema: str,
    token: str, batch_size: int,
) -> tuple[int, int]:
    _cleanup(target)
    stage_name = f"relay_stage_{time.strftime('%Y%m%d%H%M%S')}_{token[:12]}"
    stage = f"{quote_ident(schema)}.{quote_ident(stage_name)}"
    sql = target.sql
    cols = prepared.columns
    conn.execute(sql.render("spark_stage_lock", stage_name=stage_name))
    try:
        conn.execute(sql.render("spark_stage_create", stage=stage, columns=cols))
        try:
            _jdbc_append(prepared.df, target, stage, batch_size)
            with conn.transaction():
                row = conn.execute(sql.render("spark_merge", stage=stage, columns=cols)).fetchone()
                conn.execute(sql.render("spark_stage_drop", stage=stage))
        except BaseException:
            with contextlib.suppress(Exception):
                conn.execute(sql.render("spark_stage_drop", stage=stage))
            raise
    finally:
        with contextlib.suppress(Exception):
            conn.execute(sql.render("spark_stage_unlock", stage_name=stage_name))
    assert row is not None
    return int(row[0]), int(row[1])


def _write_copy(prepared: Prepared, target: _Target) -> tuple[int, int]:
    temp, cols, sql = "relay_copy", prepared.columns, target.sql
    job = CopyPartition(
        dsn=target.dsn,
        create_sql=sql.render("spark_copy_create", stage=temp, columns=cols),
        copy_sql=sql.render("spark_copy_rows", stage=temp, columns=cols),
        merge_sql=sql.render("spark_merge", stage=temp, columns=cols),
    )
    counts = prepared.df.rdd.mapPartitions(job).collect()
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def _resolve(dsn: str | None, table: str | None) -> _Target:
    settings = load_settings(table=table) if table else load_settings()
    dsn = dsn if dsn is not None else settings.pg_dsn
    names = TableNames(settings.table_schema, settings.table_name, settings.notify_channel)
    return _Target(dsn=dsn, jdbc=jdbc_target(dsn), names=names, sql=SparkSql(names))


def write_outbox(
    df: DataFrame,
    *,
    dsn: str | None = None,
    table: str | None = None,
    mode: WriteMode | str = WriteMode.STAGED,
    batch_size: int = 10_000,
    num_partitions: int | None = None,
    exchange: str | None = None,
    routing_key: str | None = None,
    validate: bool = True,
) -> WriteResult:
    """Write a DataFrame of outbox rows (exchange, routing_key, content; optionally id, options,
    ordering_key, available_at) into the relay's table.

    `dsn`/`table` default to RELAY_PG_DSN (else the PG* variables) and RELAY_TABLE. `exchange`
    and `routing_key` give a literal for a column the DataFrame lacks. Column names and types
    are checked before anything is written; with `validate`, one extra Spark pass also checks
    values (nulls, JSON text, ids). Blocking; safe to call while an asyncio loop runs.
    """
    started = time.monotonic()
    mode = WriteMode(mode)
    target = _resolve(dsn, table)
    token = secrets.token_hex(16)
    with _connect(target) as conn:
        schema, table_columns = _table_columns(conn, target)
        prepared = prepare(
            df, table=target.table, table_columns=table_columns, exchange=exchange,
            routing_key=routing_key, num_partitions=num_partitions, write_token=token,
        )
        if validate:
            check_values(prepared)
        try:
            if mode is WriteMode.STAGED:
                rows, inserted = _write_staged(
                    prepared, conn, target, schema=schema, token=token, batch_size=batch_size
                )
                result = WriteResult(mode, rows, inserted, time.monotonic() - started)
            elif mode is WriteMode.COPY:
                rows, inserted = _write_copy(prepared, target)
                result = WriteResult(mode, rows, inserted, time.monotonic() - started)
            else:
                _jdbc_append(prepared.df, target, target.table, batch_size)
                result = WriteResult(mode, None, None, time.monotonic() - started)
        except RelayError:
            raise
        except Exception as exc:
            raise SparkWriteError(
                f"{mode.value} write to {target.table} at {redact_url(target.dsn)} failed"
                f"{' (no rows were merged)' if mode is WriteMode.STAGED else ''}: "
                f"{_explain(exc, target)}"
            ) from exc
    log.info(
        "spark_outbox_written", mode=mode.value, table=target.table, rows=result.rows,
        inserted=result.inserted, elapsed_ms=round(result.elapsed_s * 1000),
    )
    return result
