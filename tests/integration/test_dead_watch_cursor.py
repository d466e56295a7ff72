"""`relay dead watch` reads only what is new (relay/pg/deadwatch.py): each look returns the
letters parked since the last one, whatever was parked before and whatever transaction
elsewhere holds the server's horizon back; a letter whose transaction commits after later
ones is shown once, when it commits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from relay.pg.deadwatch import DeadLetterCursor
from relay.pg.queries import Queries, TableNames
from tests.helpers import pg_session

Q = Queries(TableNames(None, "queue_message", "queue_message_notify"))
STORM, WAVE = 500_000, 20_000


async def _park(conn: asyncpg.Connection, tag: str, n: int = 1) -> None:
    """n dead letters of reason `<tag>: <i>`, in the connection's current transaction (or one
    of their own), as the dead-letter function writes them (dead_xact by its default)."""
    await conn.execute(
        "INSERT INTO queue_message_dead (id, exchange, routing_key, content, created_at, "
        "available_at, attempts, reason) "
        "SELECT gen_random_uuid(), 'x', 'rk', '{}'::jsonb, now(), now(), 1, $1 || ': ' || g "
        "FROM generate_series(1, $2::int) AS g", tag, n)


async def _look(cursor: DeadLetterCursor, conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [dict(row) async for row in cursor.look(conn, Q)]


async def _begin(cursor: DeadLetterCursor, conn: asyncpg.Connection,
                 since: datetime | None = None) -> list[dict[str, Any]]:
    return [dict(row) async for row in cursor.begin(conn, Q, since)]


async def test_dead_watch__a_storm_of_letters_each_look_reads_only_the_new_ones(db: str) -> None:
    """500,000 letters in waves of 20,000, a look after each, while another session holds a
    transaction open (it pins the server's horizon for the whole storm): every look returns
    exactly its wave, and the server returns no row more than that. Before, each look read
    the last ten minutes of letters again: by the last wave, 500,000 rows for 20,000 new."""
    async with pg_session(db) as conn, pg_session(db) as pinner:
        cursor = DeadLetterCursor()
        await _park(conn, "there before", 3)
        assert await _begin(cursor, conn) == []
        pin = pinner.transaction()
        await pin.start()
        await pinner.execute("SELECT pg_current_xact_id()")  # an id, running all along
        reads = []
        try:
            for wave in range(STORM // WAVE):
                await _park(conn, f"wave {wave}", WAVE)
                before = cursor.rows_read
                shown = await _look(cursor, conn)
                reads.append(cursor.rows_read - before)
                assert len(shown) == WAVE, f"wave {wave}: {len(shown)} letters shown"
                assert {r["reason"].split(":")[0] for r in shown} == {f"wave {wave}"}
            assert await _look(cursor, conn) == []
        finally:
            await pin.rollback()
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + Q["dead_from_transaction"], cursor.xmax, -1, 1000)
    assert reads == [WAVE] * (STORM // WAVE), f"rows read per look: {reads}"
    assert "queue_message_dead_xact_idx" in plan, plan  # not a scan of every letter


async def test_dead_watch__a_transaction_committing_after_later_ones_is_shown_once(
    db: str,
) -> None:
    """A letter parked by a transaction that began before the watch and commits after a later
    one is shown when it commits, once; a rolled-back one never; with `since`, the letters
    there at the start (also one parked before dead_xact was recorded) are shown by the
    beginning and never again."""
    async with (pg_session(db) as conn, pg_session(db) as slow, pg_session(db) as undone):
        await _park(conn, "old")
        await conn.execute("UPDATE queue_message_dead SET dead_xact = NULL")  # before 0028
        await _park(conn, "recent")
        slow_tx, undone_tx = slow.transaction(), undone.transaction()
        await slow_tx.start()
        await _park(slow, "slow")  # running while the watch begins
        await undone_tx.start()
        await _park(undone, "undone")

        cursor = DeadLetterCursor()
        since = await conn.fetchval("SELECT now() - interval '1 hour'")
        first = await _begin(cursor, conn, since)
        await _park(conn, "fast")  # commits first
        second = await _look(cursor, conn)
        await slow_tx.commit()
        await undone_tx.rollback()
        third = await _look(cursor, conn)
        fourth = await _look(cursor, conn)

    def reasons(rows: list[dict[str, Any]]) -> list[str]:
        return [r["reason"] for r in rows]

    assert reasons(first) == ["old: 1", "recent: 1"]
    assert reasons(second) == ["fast: 1"]
    assert reasons(third) == ["slow: 1"]
    assert fourth == []
