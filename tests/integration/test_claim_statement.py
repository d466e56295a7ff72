"""The one claim statement (query `claim`): both kinds of row in one round trip, the first
kind taking what it finds and the other only the room left; a kind with no room is not run."""

from __future__ import annotations

import asyncpg

from relay.pg.queries import Queries, TableNames
from relay.pg.seqfloor import SWEEP
from tests.helpers import pg_session

CLAIM = Queries(TableNames(None, "queue_message", "queue_message_notify"))["claim"]
KEYS_PER_BATCH = 16
NO_BYTE_LIMIT = 1 << 30


async def _claimed(conn: asyncpg.Connection, limit: int, keyed_first: bool,
                   max_bytes: int = NO_BYTE_LIMIT) -> tuple[list[str | None], int]:
    """In a transaction rolled back at once: the ordering_key of each row claimed (seq order)
    and how many per-key locks the keyed part took."""
    tx = conn.transaction()
    await tx.start()
    try:
        rows = await conn.fetch(CLAIM, limit, KEYS_PER_BATCH, False, max_bytes, SWEEP,
                                keyed_first)
        locks = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_backend_pid()")
    finally:
        await tx.rollback()
    return [r["ordering_key"] for r in sorted(rows, key=lambda r: r["seq"])], int(locks)


async def test_claim__each_kind_first_in_turn_and_the_other_in_the_room_left(db: str) -> None:
    async with pg_session(db) as conn:
        # seq order: 3 unkeyed, then a run of 3 rows of key a, then 3 unkeyed.
        await conn.execute(
            "INSERT INTO queue_message (exchange, routing_key, content, ordering_key) "
            "SELECT 'x', 'rk', jsonb_build_object('g', g), CASE WHEN g BETWEEN 4 AND 6 "
            "THEN 'a' END FROM generate_series(1, 9) g ORDER BY g")
        keys, locks = await _claimed(conn, 4, True)
        assert keys == [None, "a", "a", "a"]  # the key's run, then one unkeyed row
        assert locks == 1
        keys, locks = await _claimed(conn, 4, False)
        assert keys == [None, None, None, None]  # the room is gone: keyed part not run
        assert locks == 0
        keys, locks = await _claimed(conn, 8, False)
        assert keys == [None, None, None, "a", "a", None, None, None]  # 6 unkeyed + 2 of a
        assert locks == 1
        keys, _ = await _claimed(conn, 20, True)
        assert keys == [None, None, None, "a", "a", "a", None, None, None]


async def test_claim__the_byte_budget_spent_by_one_kind_leaves_the_other_out(db: str) -> None:
    async with pg_session(db) as conn:
        await conn.execute(
            "INSERT INTO queue_message (exchange, routing_key, content, ordering_key) "
            "VALUES ('x', 'rk', '{\"pad\": \"" + "p" * 1000 + "\"}', NULL), "
            "('x', 'rk', '{\"n\": 1}', 'a')")
        # The first row always goes, however large; then nothing is left for the key.
        keys, locks = await _claimed(conn, 10, False, 100)
        assert (keys, locks) == ([None], 0)
        # Keyed first: its small row leaves bytes over, and the unkeyed part's first row goes.
        keys, locks = await _claimed(conn, 10, True, 100)
        assert (keys, locks) == ([None, "a"], 1)
        keys, _ = await _claimed(conn, 10, True, 5)
        assert keys == ["a"]  # keyed first spent the 5 bytes: the unkeyed part is not run
