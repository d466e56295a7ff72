"""`relay migrate`: versioned SQL from sql/migrations, serialised by an advisory lock."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.pg.queries import Queries, TableNames, sql_dir
from relay.pg.store import DB_ERRORS
from relay.settings import NotifyMode

log = structlog.get_logger("relay.pg.migrate")


def migration_files() -> list[Path]:
    """The versioned migrations in apply order (file names sort by version)."""
    return sorted((sql_dir() / "migrations").glob("*.sql"))


async def migrate(conn: asyncpg.Connection, names: TableNames, notify: NotifyMode) -> list[str]:
    """Apply pending migrations and install the trigger for `notify`; return versions applied.

    One transaction holds a transaction-level advisory lock, so concurrent runs wait for each
    other and the second finds nothing left to do.
    """
    q = Queries(names)
    target = names.placeholders()["table_literal"].strip("'")
    applied_now: list[str] = []
    try:
        async with conn.transaction():
            await conn.execute(q["migration_lock"])
            await conn.execute(q["create_migrations_table"])
            done = {r["version"] for r in await conn.fetch(q["applied_migrations"], target)}
            for path in migration_files():
                version = path.stem
                if version in done:
                    continue
                await conn.execute(names.render(path.read_text(encoding="utf-8")))
                await conn.execute(q["record_migration"], target, version)
                applied_now.append(version)
                log.info("migration_applied", version=version, table=target)
            await conn.execute(q[f"install_trigger_{notify.value}"])
            if notify is not NotifyMode.OFF:
                await conn.execute(q["mark_notify_mode"].replace("{notify_mode}", notify.value))
            # Relays follow the installed mode: wake them (at commit) so they re-read it.
            await conn.execute(q["announce_notify_mode"])
    except DB_ERRORS as exc:
        raise DatabaseError(f"migration failed: {exc}") from exc
    return applied_now
