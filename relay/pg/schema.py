"""Which migrations a table has and which this relay needs (read-only; `relay migrate` applies).

Kept apart from migrate.py so that the store can check the schema when it opens without
importing the migration runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

from relay.errors import SchemaError
from relay.pg.queries import Queries, TableNames, sql_dir
from relay.settings import NotifyMode


def migration_files() -> list[Path]:
    """The versioned migrations in apply order (file names sort by version)."""
    return sorted((sql_dir() / "migrations").glob("*.sql"))


def target_of(names: TableNames) -> str:
    """The key under which relay_migrations records one outbox table's versions."""
    return names.placeholders()["table_literal"].strip("'")


async def applied_versions(conn: Any, q: Queries) -> set[str]:
    """Versions recorded for this table; empty when the migrations table does not exist yet."""
    if not await conn.fetchval(q["migrations_table_exists"]):
        return set()
    return {r["version"] for r in await conn.fetch(q["applied_migrations"], target_of(q.names))}


async def pending_versions(conn: Any, q: Queries) -> list[str]:
    """Migrations this relay ships that the table lacks, in apply order."""
    done = await applied_versions(conn, q)
    return [p.stem for p in migration_files() if p.stem not in done]


async def installed_notify_mode(conn: Any, q: Queries) -> NotifyMode | None:
    """The trigger mode installed on the table; None when the table does not exist yet."""
    if not await conn.fetchval(q["table_exists"]):
        return None
    return NotifyMode(await conn.fetchval(q["notify_mode"]))


async def require_current(conn: Any, q: Queries, table: str) -> None:
    """Refuse to work on a table whose schema is older than this relay needs."""
    try:
        pending = await pending_versions(conn, q)
    except asyncpg.InsufficientPrivilegeError as exc:
        raise SchemaError(
            f"cannot read the migrations of {table} ({exc}): run `relay migrate --roles` as "
            "the table owner, which grants the relay role SELECT on relay_migrations"
        ) from exc
    if pending:
        raise SchemaError(
            f"the schema of {table} is older than this relay needs ({', '.join(pending)} not "
            "applied): run `relay migrate`"
        )
