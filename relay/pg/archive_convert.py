"""`relay migrate --partition-archive`: the archive becomes partitioned by day in steps, so that
archiving relays' settles never wait behind the conversion for long.

An archive INSERT is the last statement of an archiving relay's settle, after the broker
confirmed the batch: a settle that waits behind a lock until its statement timeout publishes the
batch again. Done in one transaction, the conversion held ACCESS EXCLUSIVE on the archive
through a scan of every row (ATTACH checking they fit the partition) and the build of the new
key's unique index, so every settle waited as long as both took. Now:

1. Beside the archive's traffic: the unique index (id, published_at) that becomes the legacy
   partition's part of the new key (CREATE INDEX CONCURRENTLY), and a CHECK that every row was
   published before the legacy partition's bound, added NOT VALID (a moment of ACCESS EXCLUSIVE,
   waited for at most LOCK_TIMEOUT_MS, tried again) and then validated (the scan, under a lock
   that reads and INSERTs pass).
2. One short transaction under ACCESS EXCLUSIVE (the same lock timeout and retries): rename,
   the partitioned parent, the prepared index taken over as the key, ATTACH without a scan, the
   DEFAULT partition, the grants, the CHECK dropped.

The CHECK holds new rows to the bound from step 1 on; the bound is the start of the day after
tomorrow (UTC), a day at least away. A run that fails or is interrupted between the steps drops
the CHECK; a run killed outright leaves it, and the next `relay migrate` drops it (or replaces
it, with `--partition-archive`). The index is kept for the next run.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.pg.connection import DB_ERRORS
from relay.pg.queries import Queries, TableNames

log = structlog.get_logger(__name__)

# The index build and the validating scan read the whole archive; the session's command
# timeout is for ordinary statements.
SCAN_TIMEOUT_S = 6 * 3600.0


async def partition_archive(conn: asyncpg.Connection, names: TableNames, *, deadline: float,
                            lock_wait_s: float, lock_timeout_ms: int, retry_first_s: float,
                            retry_max_s: float) -> None:
    """Partition the archive by day (nothing if it is already); each step that locks waits at
    most `lock_timeout_ms` for its lock, tried again until `deadline`."""
    q = Queries(names)
    if await conn.fetchval(q["archive_is_partitioned"]):
        return
    bound = await conn.fetchval(q["archive_legacy_bound"])
    await conn.execute(q["archive_bound_setting"], bound)

    async def locked(statement: str, what: str) -> None:
        pause = retry_first_s
        while True:
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = {lock_timeout_ms}")
                    await conn.execute(statement)
                return
            except asyncpg.LockNotAvailableError as exc:
                if time.monotonic() + pause > deadline:
                    raise DatabaseError(
                        f"the archive was not partitioned: {what} found it locked for "
                        f"{lock_wait_s:.0f} s; nothing was changed. Run `relay migrate "
                        "--partition-archive` again later") from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, retry_max_s)

    done = False
    try:
        await _build_key(conn, q, names)
        log.info("archive_key_built", bound=bound.isoformat())
        await locked(q["archive_bound_add"], "adding the bound's CHECK")
        await conn.execute(q["archive_bound_validate"], timeout=SCAN_TIMEOUT_S)
        log.info("archive_bound_validated", bound=bound.isoformat())
        await locked(q["archive_partition"], "the conversion's last step")
        done = True
    except DB_ERRORS as exc:
        raise DatabaseError(f"partitioning the archive failed: {exc!r}") from exc
    finally:
        if not done:
            await drop_bound(conn, names)


async def _build_key(conn: asyncpg.Connection, q: Queries, names: TableNames) -> None:
    """The unique index (id, published_at), CONCURRENTLY; one an interrupted build left invalid
    is dropped and built again."""
    invalid = await conn.fetchval(q["invalid_index"], names.name + "_archive_key_ready")
    if invalid:
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {invalid}")
    await conn.execute(q["archive_key_build"], timeout=SCAN_TIMEOUT_S)


async def drop_bound(conn: asyncpg.Connection, names: TableNames) -> None:
    """Drop a conversion's CHECK from an archive that is not partitioned (a run that stopped
    between its steps): left, it would refuse archive INSERTs once the day after tomorrow
    came. Waits at most a moment for the lock, a few times; says so if it could not."""
    q = Queries(names)
    for _ in range(10):
        try:
            if not await conn.fetchval(q["archive_bound_left"]):
                return
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = 300")
                await conn.execute(q["archive_bound_drop"])
            log.info("archive_bound_dropped")
            return
        except asyncpg.LockNotAvailableError:
            await asyncio.sleep(0.5)
        except DB_ERRORS as exc:
            log.error("archive_bound_not_dropped", error=repr(exc))
            return
    log.error("archive_bound_not_dropped",
              error="the archive stayed locked; run `relay migrate` again before the day after "
                    "tomorrow (UTC), or archive INSERTs past it are refused")
