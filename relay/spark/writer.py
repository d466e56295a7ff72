"""`write_outbox`: a DataFrame of outbox rows into the relay's table, in one of three modes."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import structlog

from relay.dsn import redact
from relay.errors import ConfigError, RelayError
from relay.spark.copy_partition import write_copy
from relay.spark.dsn import loopback_hosts
from relay.spark.errors import SparkWriteError
from relay.spark.frame import check_values, prepare
from relay.spark.runtime import master_is_local
from relay.spark.staged import cleanup_staging, stage_schema, stage_shape, write_staged
from relay.spark.target import Target, connect, explain, jdbc_append, outbox_columns, resolve

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame

log = structlog.get_logger("relay.spark")

__all__ = ["WriteMode", "WriteResult", "cleanup_staging", "write_outbox"]


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


def check_reachable(master: str, params: dict[str, str]) -> None:
    """A loopback database host means each executor itself: refuse it on a real cluster."""
    hosts = loopback_hosts(params)
    if hosts and not master_is_local(master):
        raise ConfigError(
            f"the database host {hosts[0]!r} is the loopback (or a unix socket), but the Spark "
            f"master {master!r} runs executors on other machines, where it would name each "
            "executor itself: give RELAY_PG_DSN (or dsn=) a host name the executors can reach"
        )


def _check_append_allowed(conn: psycopg.Connection[Any], target: Target) -> None:
    row = conn.execute(target.sql.render("spark_can_select_table")).fetchone()
    if not (row and row[0]):
        raise ConfigError(
            f"append mode needs SELECT on {target.table} (Spark's JDBC writer reads the table's "
            "schema with SELECT * after writing); this role lacks it: use mode 'staged' (the "
            "Spark writer role's mode) or a role that may read the table"
        )


def _check_arguments(mode: WriteMode, order_by: Sequence[str], max_connections: int) -> None:
    if max_connections < 1:
        raise ConfigError(f"max_connections={max_connections}: must be at least 1")
    if order_by and mode is not WriteMode.STAGED:
        raise ConfigError(
            f"order_by needs mode='staged' (mode {mode.value!r} commits partitions separately, "
            "so it cannot order rows across them)"
        )


def write_outbox(
    df: DataFrame,
    *,
    dsn: str | None = None,
    table: str | None = None,
    mode: WriteMode | str = WriteMode.STAGED,
    key: Sequence[str] | None = None,
    ids: str | None = None,
    order_by: Sequence[str] = (),
    max_connections: int = 8,
    batch_size: int = 10_000,
    exchange: str | None = None,
    routing_key: str | None = None,
    fairness_key: str | None = None,
    validate: bool = True,
) -> WriteResult:
    """Write a DataFrame of outbox rows (exchange, routing_key, content; optionally id, options,
    ordering_key, available_at, fairness_key) into the relay's table.

    `fairness_key` (or a `fairness_key` column) marks the job's rows for the relay's claims,
    which are fair between fairness keys (docs/fairness.md): `fairness_key="backfill"` keeps
    the job's rows from holding back other producers' rows, whatever its transactions.

    Ids: `key` names the columns of each event's natural key (id = outbox_id(key); key columns
    that are not outbox columns are not written), or the DataFrame has an `id` column; the
    idempotent modes refuse neither unless `ids="random"` (not retry-safe). `order_by` (staged)
    makes seq follow those columns within each ordering_key. At most `max_connections`
    partitions write at once. Blocking; safe to call while an asyncio loop runs.
    """
    started = time.monotonic()
    mode = WriteMode(mode)
    _check_arguments(mode, order_by, max_connections)
    target = resolve(dsn, table)
    check_reachable(str(df.sparkSession.conf.get("spark.master", "local[*]")), target.params)
    with connect(target) as conn:
        schema, table_columns = outbox_columns(conn, target)
        if mode is WriteMode.APPEND:
            _check_append_allowed(conn, target)
        prepared = prepare(
            df, table=target.table, table_columns=table_columns, exchange=exchange,
            routing_key=routing_key, fairness_key=fairness_key, key=key, ids=ids,
            order_by=order_by,
            idempotent=mode is not WriteMode.APPEND,
        )
        if validate:
            check_values(prepared)
        shape = stage_shape(prepared, table_columns)
        try:
            counts: tuple[int | None, int | None] = (None, None)
            if mode is WriteMode.STAGED:
                counts = write_staged(
                    prepared, conn, target, shape=shape,
                    schema=stage_schema(conn, target, schema),
                    token=secrets.token_hex(16), batch_size=batch_size,
                    max_connections=max_connections,
                )
            elif mode is WriteMode.COPY:
                counts = write_copy(prepared, target, shape, max_connections)
            else:
                jdbc_append(prepared.df, target, target.table, batch_size, max_connections)
            result = WriteResult(mode, counts[0], counts[1], time.monotonic() - started)
        except RelayError:
            raise
        except Exception as exc:
            raise SparkWriteError(
                f"{mode.value} write to {target.table} at {redact(target.dsn)} failed"
                f"{' (no rows were merged)' if mode is WriteMode.STAGED else ''}: "
                f"{explain(exc, target)}"
            ) from exc
    log.info(
        "spark_outbox_written", mode=mode.value, table=target.table, rows=result.rows,
        inserted=result.inserted, elapsed_ms=round(result.elapsed_s * 1000),
    )
    return result
