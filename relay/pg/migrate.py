"""`relay migrate`: versioned SQL from sql/migrations, serialised by an advisory lock.

Safe on every deploy: applying is idempotent, concurrent runs wait for each other, and the
installed notify mode is kept unless one is asked for explicitly.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.pg.archive import partitions_ahead
from relay.pg.archive_convert import drop_bound
from relay.pg.archive_convert import partition_archive as partition_archive_by_day
from relay.pg.connection import DB_ERRORS
from relay.pg.queries import Queries, TableNames
from relay.pg.schema import (
    applied_versions,
    installed_notify_mode,
    migration_files,
    target_of,
)
from relay.settings import NotifyMode

log = structlog.get_logger("relay.pg.migrate")

__all__ = ["Plan", "migrate", "migration_files", "plan"]

DEFAULT_NOTIFY = NotifyMode.CONDITIONAL


@dataclass
class Plan:
    """What `relay migrate` would do to one table."""

    pending: list[str] = field(default_factory=list)
    installed_notify: NotifyMode | None = None  # None: no relay schema on the table yet
    notify: NotifyMode = DEFAULT_NOTIFY

    @property
    def notify_changes(self) -> bool:
        """The trigger mode differs from the installed one (or none is installed yet)."""
        return self.installed_notify is not self.notify

    @property
    def up_to_date(self) -> bool:
        """Nothing to apply and the trigger mode stays."""
        return not self.pending and not self.notify_changes

    def describe(self) -> str:
        """One line for people: versions to apply and the trigger mode."""
        versions = ", ".join(self.pending) if self.pending else "none pending"
        if self.installed_notify is None:
            trigger = f"notify trigger: {self.notify.value} (new)"
        elif self.notify_changes:
            trigger = f"notify trigger: {self.installed_notify.value} -> {self.notify.value}"
        else:
            trigger = f"notify trigger: {self.notify.value} (kept)"
        return f"migrations: {versions}; {trigger}"


async def plan(conn: asyncpg.Connection, names: TableNames,
               requested: NotifyMode | None) -> Plan:
    """What migrate would do; `requested` None keeps the installed notify mode."""
    q = Queries(names)
    done = await applied_versions(conn, q)
    pending = [p.stem for p in migration_files() if p.stem not in done]
    # A table of the classic shape has a trigger-less past, not a chosen mode "off".
    installed = await installed_notify_mode(conn, q) if done else None
    chosen = requested or installed or DEFAULT_NOTIFY
    return Plan(pending, installed, chosen)


# Each attempt's DDL waits this long for its lock on the live outbox; producers' INSERTs queue
# behind a waiting ACCESS EXCLUSIVE request, so a longer wait would stall their transactions.
LOCK_TIMEOUT_MS = 300
# Between attempts: from this, doubling, up to RETRY_MAX_S.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0


async def migrate(conn: asyncpg.Connection, names: TableNames,
                  notify: NotifyMode | None = None, *, lock_wait_s: float = 300.0,
                  partition_archive: bool = False) -> list[str]:
    """Apply pending migrations and install the trigger; return the versions applied. With
    `partition_archive`, then partition the archive by day, in steps that hold its lock only a
    moment (relay/pg/archive_convert.py: the old archive kept as its first partition). A
    partitioned archive gets its partitions for the coming days (relay/pg/archive.py) either
    way.

    `notify` None keeps the mode installed on the table (the default for a new table is
    conditional). The run holds an advisory lock for its session, so concurrent runs wait for
    each other (polling) and the second finds nothing left to do.

    Nothing to apply and the trigger mode kept: nothing is changed and no lock is taken on the
    outbox. Otherwise the DDL waits at most LOCK_TIMEOUT_MS for its lock (a reader of the
    outbox holds it off, and every producer's INSERT would queue behind the waiting DDL), and
    the whole attempt is retried until `lock_wait_s` has passed.
    """
    deadline = time.monotonic() + lock_wait_s
    await _take_migration_lock(conn, names, deadline)
    try:
        applied = await _migrate_retrying(conn, names, notify, deadline, lock_wait_s)
        if partition_archive:
            await partition_archive_by_day(
                conn, names, deadline=deadline, lock_wait_s=lock_wait_s,
                lock_timeout_ms=LOCK_TIMEOUT_MS, retry_first_s=RETRY_FIRST_S,
                retry_max_s=RETRY_MAX_S)
        else:
            await drop_bound(conn, names)  # what a conversion killed between its steps left
        await _partitions_ahead_retrying(conn, names, deadline)
        return applied
    finally:
        try:
            await conn.execute(Queries(names)["migration_session_unlock"])
        except DB_ERRORS as exc:  # the session's end releases it anyway
            log.warning("migration_unlock_failed", error=repr(exc))


async def _partitions_ahead_retrying(conn: asyncpg.Connection, names: TableNames,
                                     deadline: float) -> None:
    """The coming days' archive partitions; each CREATE waits at most 100 ms for its lock
    (sql/migrations/0026), tried again until `deadline` while a reader holds the archive, then
    left to the archiving relays (the DEFAULT partition catches rows meanwhile)."""
    while True:
        try:
            await partitions_ahead(conn, Queries(names))
            return
        except DatabaseError as exc:
            if not isinstance(exc.__cause__, asyncpg.LockNotAvailableError):
                raise
            if time.monotonic() >= deadline:
                log.warning("archive_partitions_deferred", error=str(exc),
                            reason="another session holds the archive; the archiving relays "
                                   "make the coming days' partitions")
                return
            await asyncio.sleep(PARTITIONS_RETRY_S)


PARTITIONS_RETRY_S = 0.5


async def _take_migration_lock(conn: asyncpg.Connection, names: TableNames,
                               deadline: float) -> None:
    """One `relay migrate` per database at a time (the session-level lock, polled)."""
    said = False
    while True:
        try:
            if await conn.fetchval(Queries(names)["migration_session_lock"]):
                return
        except DB_ERRORS as exc:
            raise DatabaseError(f"migration failed: {exc!r}") from exc
        if time.monotonic() > deadline:
            raise DatabaseError("migration not applied: another `relay migrate` kept running; "
                                "nothing was changed")
        if not said:
            log.info("migration_waiting_for_another_run")
            said = True
        await asyncio.sleep(0.2)


async def _migrate_retrying(conn: asyncpg.Connection, names: TableNames,
                            notify: NotifyMode | None, deadline: float,
                            lock_wait_s: float) -> list[str]:
    pause = RETRY_FIRST_S
    attempts = 0
    while True:
        attempts += 1
        try:
            return await _migrate_once(conn, names, notify)
        except asyncpg.LockNotAvailableError as exc:
            holders = await _lock_holders(conn, names)
            if time.monotonic() + pause > deadline:
                raise DatabaseError(
                    f"migration not applied: the outbox stayed locked by other sessions for "
                    f"{lock_wait_s:.0f} s ({attempts} attempts; holding it: {holders}); nothing "
                    "was changed. End those sessions or run `relay migrate` again later "
                    "(--lock-wait-s sets how long it tries)") from exc
            log.warning("migration_waiting_for_lock", table=target_of(names),
                        attempt=attempts, retry_in_s=pause, holders=holders)
        except DB_ERRORS as exc:
            raise DatabaseError(f"migration failed: {exc!r}") from exc
        await asyncio.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)


# In a migration file, the statements after this line run one by one outside the migration's
# transaction, after it commits (CREATE INDEX CONCURRENTLY: a new index on a live outbox never
# blocks producers' INSERTs while it builds); the version is recorded once they are done.
OUTSIDE_MARKER = "-- relay: outside the transaction"
# A CONCURRENTLY build on a large outbox may take long; the session's command timeout is
# for ordinary statements.
OUTSIDE_TIMEOUT_S = 6 * 3600.0
_INDEX_NAME = re.compile(r"CREATE\s+INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)",
                         re.IGNORECASE)


def split_migration(text: str) -> tuple[str, list[str]]:
    """A migration's transactional part and its statements to run outside a transaction."""
    inside, _, outside = text.partition(OUTSIDE_MARKER)
    code = "\n".join(line for line in outside.splitlines() if not line.lstrip().startswith("--"))
    return inside, [s.strip() for s in code.split(";") if s.strip()]


async def _migrate_once(conn: asyncpg.Connection, names: TableNames,
                        notify: NotifyMode | None) -> list[str]:
    q = Queries(names)
    target = target_of(names)
    applied_now: list[str] = []
    outside: list[tuple[str, list[str]]] = []
    async with conn.transaction():
        # (The run's own lock is held already, _take_migration_lock.) Before any look-up: a
        # DDL statement makes this backend read the catalog changes that the run we waited
        # for committed. to_regclass() alone takes no lock and may
        # answer from a stale catalog cache ("no migrations table"), applying all again.
        await conn.execute(q["create_migrations_table"])
        todo = await plan(conn, names, notify)
        if todo.up_to_date:
            return applied_now
        await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        for path in migration_files():
            version = path.stem
            if version not in todo.pending:
                continue
            inside, statements = split_migration(names.render(path.read_text(encoding="utf-8")))
            await conn.execute(inside)
            if statements:
                outside.append((version, statements))  # recorded once they are done
                continue
            await conn.execute(q["record_migration"], target, version)
            applied_now.append(version)
            log.info("migration_applied", version=version, table=target)
        await conn.execute(q[f"install_trigger_{todo.notify.value}"])
        await conn.execute(q["stream_notify_off" if todo.notify is NotifyMode.OFF
                             else "stream_notify_on"])
        if todo.notify is not NotifyMode.OFF:
            await conn.execute(
                q["mark_notify_mode"].replace("{notify_mode}", todo.notify.value))
        # Relays follow the installed mode: wake them (at commit) so they re-read it.
        await conn.execute(q["announce_notify_mode"])
    if outside:
        applied_now += await _outside_the_transaction(conn, q, target, outside)
    return applied_now


async def _outside_the_transaction(conn: asyncpg.Connection, q: Queries, target: str,
                                   outside: list[tuple[str, list[str]]]) -> list[str]:
    """Run each version's statements alone (no lock_timeout: a CONCURRENTLY build waits for
    older transactions, never blocking producers), then record the version; under the run's
    migration lock. An index an interrupted build left invalid is dropped and built again."""
    done: list[str] = []
    for version, statements in outside:
        for statement in statements:
            name = _INDEX_NAME.search(statement)
            invalid = name and await conn.fetchval(q["invalid_index"], name.group(1))
            if invalid:
                await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {invalid}")
            await conn.execute(statement, timeout=OUTSIDE_TIMEOUT_S)
        await conn.execute(q["record_migration"], target, version)
        done.append(version)
        log.info("migration_applied", version=version, table=target)
    return done


async def _lock_holders(conn: asyncpg.Connection, names: TableNames) -> str:
    """The sessions holding a lock on the outbox, for the message: pid, user, state, since."""
    try:
        rows = await conn.fetch(Queries(names)["outbox_lock_holders"])
    except DB_ERRORS as exc:
        return f"unknown ({exc})"
    return "; ".join(f"pid {r['pid']} ({r['usename']}, {r['state']}, for {r['age_s']:.0f} s)"
                     for r in rows) or "none now"
