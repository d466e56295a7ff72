"""`relay dead watch`: dead letters as they are parked, each once, at a cost per look that does
not grow with the letters parked before.

Each dead letter records the transaction that parked it (`dead_xact`, sql/migrations/0028). A
look reads inside a REPEATABLE READ transaction, so all it reads is one snapshot, and it
remembers that snapshot's bounds: the first transaction id not yet given out (xmax) and the ids
still running (xip). Every letter of a transaction that had ended by then was read; the next
look reads only the letters of the transactions that had not: those still running then (a
lookup each), and those from xmax on. A long transaction elsewhere (a pg_dump, a report) costs
one lookup per look, not a re-read of everything parked since it began.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from relay.errors import DatabaseUnavailable
from relay.pg.config import DatabaseConfig
from relay.pg.connection import DB_ERRORS, session
from relay.pg.queries import Queries

WATCH_POLL_S = 5.0  # a look at least this often, whatever the channel says
WATCH_RETRY_S = 5.0  # after the database went away
WATCH_PAGE = 1000


@dataclass
class DeadLetterCursor:
    """Where a watch is in the order letters were parked in: the bounds of the snapshot the last
    look read (transaction ids as numbers), and how many rows the server returned so far."""

    xmax: int | None = None
    running: list[int] = field(default_factory=list)
    rows_read: int = 0

    async def begin(self, conn: asyncpg.Connection, q: Queries,
                    since: datetime | None) -> AsyncIterator[asyncpg.Record]:
        """Start the cursor at the current snapshot: with `since`, the letters parked at or
        after it that are there now (oldest first), also those parked before the dead_xact
        column existed; without it, nothing (what is there now is not news)."""
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            snapshot = await _snapshot(conn, q)
            if since is not None:
                after_at, after_id = since, -1
                while True:
                    rows = await conn.fetch(q["dead_since"], after_at, after_id, WATCH_PAGE)
                    self.rows_read += len(rows)
                    for row in rows:
                        yield row
                    if len(rows) < WATCH_PAGE:
                        break
                    after_at, after_id = rows[-1]["dead_at"], rows[-1]["dead_id"]
        self.xmax, self.running = snapshot

    async def look(self, conn: asyncpg.Connection, q: Queries) -> AsyncIterator[asyncpg.Record]:
        """The letters parked since the last look's snapshot, in the order of their
        transactions, each once; then the cursor moves to this look's snapshot."""
        if self.xmax is None:
            raise RuntimeError("DeadLetterCursor.look before begin")
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            snapshot = await _snapshot(conn, q)
            if self.running:  # transactions that were running at the last look, now ended
                rows = await conn.fetch(q["dead_of_transactions"], self.running)
                self.rows_read += len(rows)
                for row in rows:
                    yield row
            after_xact, after_id = self.xmax, -1
            while True:
                rows = await conn.fetch(q["dead_from_transaction"], after_xact, after_id,
                                        WATCH_PAGE)
                self.rows_read += len(rows)
                for row in rows:
                    yield row
                if len(rows) < WATCH_PAGE:
                    break
                after_xact, after_id = rows[-1]["dead_xact"], rows[-1]["dead_id"]
        self.xmax, self.running = snapshot


async def _snapshot(conn: asyncpg.Connection, q: Queries) -> tuple[int, list[int]]:
    """The bounds of the transaction's snapshot: xmax and the ids still running."""
    row = await conn.fetchrow(q["dead_watch_snapshot"])
    if row is None:  # a SELECT over one function call: always one row
        raise RuntimeError("dead_watch_snapshot returned no row")
    return int(row["xmax"]), [int(x) for x in row["xip"]]


def _shown(row: asyncpg.Record) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("dead_id", "dead_xact")}


async def watch_dead_letters(db: DatabaseConfig, since: datetime | None, *,
                             on_outage: Callable[[str], None] | None = None,
                             poll_s: float = WATCH_POLL_S) -> AsyncIterator[dict[str, Any]]:
    """Dead letters as they are parked, each once: those parked at or after `since` first, or
    (without it) none that was there when the watch began. Woken by the dead-letter channel's
    notifications (query dead_letter) and looking every `poll_s` besides; when the database
    goes away, `on_outage(why)`, and again after WATCH_RETRY_S from where it was."""
    q = db.queries
    cursor = DeadLetterCursor()
    woken = asyncio.Event()
    while True:
        failure: BaseException | None = None
        try:
            async with session(db, "cli") as conn:
                await conn.add_listener(q.names.dead_channel, lambda *_: woken.set())
                if cursor.xmax is None:
                    async for row in cursor.begin(conn, q, since):
                        yield _shown(row)
                while True:
                    woken.clear()
                    async for row in cursor.look(conn, q):
                        yield _shown(row)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(poll_s):
                            await woken.wait()
        except DatabaseUnavailable as exc:
            failure = exc
        except DB_ERRORS as exc:
            failure = exc
        if on_outage is not None:
            on_outage(str(failure))
        await asyncio.sleep(WATCH_RETRY_S)
