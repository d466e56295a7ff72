"""A keyed claim's cost does not grow with rows it cannot take (sql/migrations/
0013_keyed_claim_bounded.sql): a key whose head is retrying, with tens of thousands of due rows
behind it, costs every claim a bounded walk, and the other keys and the unkeyed rows are
claimed beside it."""

from __future__ import annotations

import asyncpg

from relay.pg.queries import Queries, TableNames
from relay.pg.seqfloor import FROM_START
from tests.helpers import pg_session
from tests.kit.producer import insert_rows

CLAIM = Queries(TableNames(None, "queue_message", "queue_message_notify"))["claim"]
LIMIT = 500
KEYS_PER_BATCH = 16
NO_BYTE_LIMIT = 1 << 30
MAX_MESSAGE = 16 << 20
BEHIND_BLOCKED = 50_000
OTHER_KEYS = 40
# Rows the claim may read from the table: its two bounded walks (4 x (500 + 16) rows, then
# 4 x 16 + 64 keys), the runs it takes and the unkeyed part, with room to spare; the claim
# this replaced read every row behind the blocked head (50,000 and more).
READ_BOUND = 10_000


async def _fill(conn: asyncpg.Connection) -> None:
    await insert_rows(conn, "x", "rk", ({"early": g} for g in range(1, 4)),
                      ordering_keys="early", delay_s=-3600)
    # The blocked key: its head retries in an hour, every row behind it is due.
    await insert_rows(conn, "x", "rk", [{"head": True}], ordering_keys="blocked", delay_s=3600)
    await insert_rows(conn, "x", "rk", ({"behind": g} for g in range(1, BEHIND_BLOCKED + 1)),
                      ordering_keys="blocked", delay_s=-1800)
    others = range(1, 2 * OTHER_KEYS + 1)
    await insert_rows(conn, "x", "rk", ({"g": g} for g in others),
                      ordering_keys=[f"k{g % OTHER_KEYS}" for g in others])
    await insert_rows(conn, "x", "rk", ({"unkeyed": g} for g in range(1, 11)))
    await conn.execute("ANALYZE queue_message")


async def _claim_reading(conn: asyncpg.Connection, keyed_first: bool,
                         ) -> tuple[list[asyncpg.Record], int]:
    """In a transaction rolled back at once: the rows claimed and how many rows the claim
    read from the outbox table (this transaction's own table statistics)."""
    read = ("SELECT COALESCE(idx_tup_fetch, 0) + COALESCE(seq_tup_read, 0) "
            "FROM pg_stat_xact_user_tables WHERE relid = 'queue_message'::regclass")
    tx = conn.transaction()
    await tx.start()
    try:
        before = await conn.fetchval(read)
        rows = await conn.fetch(CLAIM, LIMIT, KEYS_PER_BATCH, False, NO_BYTE_LIMIT, FROM_START,
                                keyed_first, None, MAX_MESSAGE, None, FROM_START, False)
        after = await conn.fetchval(read)
    finally:
        await tx.rollback()
    return rows, int(after - before)


async def test_keyed_claim__a_blocked_key_costs_a_bounded_walk_and_the_others_flow(
    db: str,
) -> None:
    async with pg_session(db) as conn:
        await _fill(conn)
        for keyed_first in (True, False):
            rows, read = await _claim_reading(conn, keyed_first)
            assert read < READ_BOUND, f"the claim read {read} rows (keyed first: {keyed_first})"
            keys = [r["ordering_key"] for r in rows]
            assert "blocked" not in keys
            assert keys.count(None) == 10, "every unkeyed row is claimed beside the keyed part"
            assert keys.count("early") == 3, "the oldest due key, found by the walk of due rows"
            # The other keys come from the walk of keys once the walk of due rows stopped at
            # its bound: every key the batch may take, each with its whole run, none twice.
            taken = {k for k in keys if k not in (None, "early")}
            assert len(taken) == KEYS_PER_BATCH - 1
            assert all(keys.count(k) == 2 for k in taken)
            assert len({r["id"] for r in rows}) == len(rows), "a row claimed twice"
