"""Staged mode: JDBC into a job-private staging table, then one merge on the driver."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

import structlog

from relay.pg.queries import quote_ident
from relay.spark.errors import OutboxColumnError
from relay.spark.frame import Prepared
from relay.spark.sql import StageShape
from relay.spark.target import Target, connect, jdbc_append, resolve

if TYPE_CHECKING:
    import psycopg

log = structlog.get_logger("relay.spark")


def cleanup_staging(dsn: str | None = None, table: str | None = None) -> list[str]:
    """Drop staging tables left by crashed jobs (whose driver no longer holds their lock).

    Runs at the start of every staged write; also `python -m relay.spark cleanup`. A table
    this login may not drop (another login's) is left, with a warning.
    """
    target = resolve(dsn, table)
    return cleanup(target)


def cleanup(target: Target) -> list[str]:
    """Drop the stale staging tables next to the target table; the names dropped."""
    import psycopg

    dropped = []
    with connect(target) as conn:
        stale = [str(r[0]) for r in conn.execute(target.sql.render("spark_stale_stages"))]
        for stage in stale:
            try:
                conn.execute(target.sql.render("spark_stage_drop", stage=stage))
            except psycopg.errors.InsufficientPrivilege:
                log.warning("spark_stale_stage_not_owned", stage=stage)
                continue
            dropped.append(stage)
            log.warning("spark_stale_stage_dropped", stage=stage)
    return dropped


def stage_schema(conn: psycopg.Connection[Any], target: Target, outbox_schema: str) -> str:
    """Where staging tables go: the outbox's staging schema (<table>_stage, made by `relay
    migrate`), so the Spark role needs CREATE there only; the outbox's own schema for a table
    migrated before that schema existed."""
    row = conn.execute(target.sql.render("spark_stage_schema")).fetchone()
    return str(row[0]) if row and row[0] else outbox_schema


def stage_shape(prepared: Prepared, table_columns: dict[str, str]) -> StageShape:
    """The staging table of a prepared write: its columns (catalog types), id, sort columns."""
    defs = {c: table_columns[c] for c in prepared.columns}
    if "id" not in defs:  # ids="random": the staging table draws them, as the outbox would
        defs = {"id": "uuid DEFAULT gen_random_uuid()", **defs}
    defs |= prepared.extra_columns
    return StageShape(defs=defs, columns=["id", *[c for c in prepared.columns if c != "id"]],
                      order_by=prepared.order_by)


def _merge(conn: psycopg.Connection[Any], target: Target, stage: str,
           shape: StageShape) -> tuple[int, int]:
    sql = target.sql
    with conn.transaction():
        row = conn.execute(sql.render("spark_merge", stage=stage, shape=shape)).fetchone()
        assert row is not None
        # Every staged row inserted means no id came twice: the check (a pass over the stage)
        # is needed only when some were skipped; a conflict then rolls the merge back.
        if row[1] < row[0]:
            clash = conn.execute(
                sql.render("spark_conflicting_id", stage=stage, shape=shape)).fetchone()
            if clash is not None:
                raise OutboxColumnError(
                    f"id {clash[0]} is given to two rows with different content; nothing "
                    "was merged (give each event its own key)"
                )
        conn.execute(sql.render("spark_stage_drop", stage=stage))
    return int(row[0]), int(row[1])


def write_staged(
    prepared: Prepared, conn: psycopg.Connection[Any], target: Target, *, shape: StageShape,
    schema: str, token: str, batch_size: int, max_connections: int,
) -> tuple[int, int]:
    """Stage the rows over JDBC, then check and merge them in one transaction: (rows, inserted)."""
    cleanup(target)
    stage_name = f"relay_stage_{time.strftime('%Y%m%d%H%M%S')}_{token[:12]}"
    stage = f"{quote_ident(schema)}.{quote_ident(stage_name)}"
    sql = target.sql
    conn.execute(sql.render("spark_stage_lock", stage_name=stage_name))
    try:
        conn.execute(sql.render("spark_stage_create", stage=stage, shape=shape))
        try:
            jdbc_append(prepared.df, target, stage, batch_size, max_connections)
            return _merge(conn, target, stage, shape)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.execute(sql.render("spark_stage_drop", stage=stage))
            raise
    finally:
        with contextlib.suppress(Exception):
            conn.execute(sql.render("spark_stage_unlock", stage_name=stage_name))
