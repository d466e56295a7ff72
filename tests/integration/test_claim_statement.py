"""The one claim statement (query `claim`): both kinds of row in one round trip, the first
kind taking what it finds and the other only the room left; a kind with no room is not run."""

from __future__ import annotations

import asyncpg

from relay.pg.queries import Queries, TableNames
from relay.pg.seqfloor import FROM_START
from tests.helpers import pg_session
from tests.kit.producer import insert_rows

CLAIM = Queries(TableNames(None, "queue_message", "queue_message_notify"))["claim"]
KEYS_PER_BATCH = 16
NO_BYTE_LIMIT = 1 << 30
MAX_MESSAGE = 16 << 20  # RELAY_MAX_MESSAGE_BYTES


async def _claimed(conn: asyncpg.Connection, limit: int, keyed_first: bool,
                   max_bytes: int = NO_BYTE_LIMIT) -> tuple[list[str | None], int]:
    """In a transaction rolled back at once: the ordering_key of each row claimed (seq order)
    and how many per-key locks the keyed part took."""
    tx = conn.transaction()
    await tx.start()
    try:
        rows = await conn.fetch(CLAIM, limit, KEYS_PER_BATCH, False, max_bytes, FROM_START,
                                keyed_first, None, MAX_MESSAGE, None, FROM_START, False)
        locks = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_backend_pid()")
    finally:
        await tx.rollback()
    return [r["ordering_key"] for r in sorted(rows, key=lambda r: r["seq"])], int(locks)


async def test_claim__each_kind_first_in_turn_and_the_other_in_the_room_left(db: str) -> None:
    async with pg_session(db) as conn:
        # seq order: 3 unkeyed, then a run of 3 rows of key a, then 3 unkeyed.
        await insert_rows(conn, "x", "rk", ({"g": g} for g in range(1, 10)),
                          ordering_keys=["a" if 4 <= g <= 6 else None for g in range(1, 10)])
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
        await insert_rows(conn, "x", "rk", [{"pad": "p" * 1000}])
        await insert_rows(conn, "x", "rk", [{"n": 1}], ordering_keys="a")
        # The first row always goes, however large; then nothing is left for the key.
        keys, locks = await _claimed(conn, 10, False, 100)
        assert (keys, locks) == ([None], 0)
        # Keyed first: its small row leaves bytes over, and the unkeyed part's first row goes.
        keys, locks = await _claimed(conn, 10, True, 100)
        assert (keys, locks) == ([None, "a"], 1)
        keys, _ = await _claimed(conn, 10, True, 5)
        assert keys == ["a"]  # keyed first spent the 5 bytes: the unkeyed part is not run


async def test_claim__the_fair_round_reads_each_transaction_from_its_own_index_range(
    db: str,
) -> None:
    """With a bulk transaction's rows in the table and statistics that know it (autovacuum's
    ANALYZE), each one-row transaction of the fair round is found through the (xact, seq)
    index: a plan that walked the seq index filtering on xact read the bulk's rows once per
    transaction (32 x ~20 ms per claim, the drain fell to a quarter of its speed)."""
    async with pg_session(db) as conn:
        await insert_rows(conn, "x", "rk", ({"g": g} for g in range(1, 30_001)))
        await conn.execute("ANALYZE queue_message")
        for i in range(40):
            await insert_rows(conn, "x", "rk", [{"live": i}])
        # The plan the server picks for this claim's values, and the generic plan it keeps
        # once a prepared claim has run a few times.
        for plan_mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {plan_mode}")
            rows, read = await _claim_reading(conn)
            live = [r for r in rows if r["seq"] > min(r["seq"] for r in rows) + 30_000 - 1]
            assert len(rows) == 500
            assert len(live) >= 31, f"{plan_mode}: the fair round took {len(live)} transactions"
            assert read <= 2_000, f"{plan_mode}: the claim read {read} index entries for 500 rows"


async def _claim_reading(conn: asyncpg.Connection) -> tuple[list[asyncpg.Record], int]:
    """An unkeyed-first claim of 500 rows, rolled back; the rows and the index entries read."""
    count = ("SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index "
             "WHERE indrelid = 'queue_message'::regclass")
    claim = await conn.prepare(CLAIM)
    tx = conn.transaction()
    await tx.start()
    try:
        before = int(await conn.fetchval(count))
        rows = await claim.fetch(500, KEYS_PER_BATCH, False, NO_BYTE_LIMIT, FROM_START, False, None,
                                     MAX_MESSAGE, None, FROM_START, False)
        read = int(await conn.fetchval(count)) - before
    finally:
        await tx.rollback()
    return rows, read


async def test_claim__the_express_lane_takes_newer_transactions_and_the_drain_the_rest(
    db: str,
) -> None:
    """While the express lane runs, it claims the rows of transactions newer than the drain's
    start (query claim_express, `after`), and the drain's own fair round stops at that
    transaction ($7, `upto`), so a row committed meanwhile goes with the lane's small batch."""
    async with pg_session(db) as conn:
        await insert_rows(conn, "x", "rk", ({"g": g} for g in range(1, 201)))
        base = int(await conn.fetchval("SELECT max(xact)::text FROM queue_message"))
        for i in range(3):
            await insert_rows(conn, "x", "rk", [{"live": i}])
        live = {r[0] for r in await conn.fetch(
            "SELECT seq FROM queue_message WHERE xact > $1::text::xid8", str(base))}
        express = Queries(TableNames(None, "queue_message", "queue_message_notify"))[
            "claim_express"]
        tx = conn.transaction()
        await tx.start()
        try:
            drain = {r["seq"] for r in await conn.fetch(
                CLAIM, 100, KEYS_PER_BATCH, False, NO_BYTE_LIMIT, FROM_START, False, str(base),
                MAX_MESSAGE, None, FROM_START, False)}
            lane = {r["seq"] for r in await conn.fetch(
                express, 64, NO_BYTE_LIMIT, FROM_START, str(base), MAX_MESSAGE)}
        finally:
            await tx.rollback()
    assert len(drain) == 100
    assert not drain & live, "the drain's claim took a newer row"
    assert lane == live, f"the express claim took {sorted(lane)}, not {sorted(live)}"
