"""Claims fair between producers' fairness keys (sql/migrations/0012_fairness_key.sql, query
`claim`): one key's burst of many transactions cannot hold back another key's rows, and with
more keys than one claim visits, the next claim goes on where the last one stopped."""

from __future__ import annotations

import asyncpg

from relay.pg.queries import Queries, TableNames
from relay.pg.seqfloor import FROM_START
from relay.pg.store import FairKeyCursor
from tests.helpers import pg_session

CLAIM = Queries(TableNames(None, "queue_message", "queue_message_notify"))["claim"]
BATCH = 500
NO_BYTE_LIMIT = 1 << 30
MAX_MESSAGE = 16 << 20


async def _insert(conn: asyncpg.Connection, rows: int, fairness_key: str | None,
                  tag: str) -> None:
    """One transaction of `rows` rows (a hand-written INSERT: the fairness_key column is the
    subject here)."""
    await conn.execute(
        "INSERT INTO queue_message (exchange, routing_key, content, fairness_key) "
        "SELECT 'x', 'rk', jsonb_build_object('tag', $1::text, 'g', g), $2::text "
        "FROM generate_series(1, $3::int) g ORDER BY g", tag, fairness_key, rows)


async def _claims_until(conn: asyncpg.Connection, tag: str, cursor: FairKeyCursor,
                        most: int) -> int:
    """Claim batches as a relay does (unkeyed first, each deleted once claimed) until every
    row tagged `tag` is gone; the number of claims it took."""
    for n in range(1, most + 1):
        async with conn.transaction():
            start = cursor.start
            records = await conn.fetch(CLAIM, BATCH, 16, False, NO_BYTE_LIMIT, FROM_START, False,
                                       None, MAX_MESSAGE, start, FROM_START, False)
            cursor.served(start, [r["fair_key"] for r in records if r["fair_key"] is not None])
            await conn.execute("DELETE FROM queue_message WHERE seq = ANY($1::bigint[])",
                               [r["seq"] for r in records])
        if not await conn.fetchval(
                "SELECT count(*) FROM queue_message WHERE content->>'tag' = $1", tag):
            return n
    return most + 1


async def _burst_with_a_quiet_tenant_inside(conn: asyncpg.Connection,
                                            keyed: bool) -> None:
    """Tenant a: 400 transactions of 50 rows; tenant b's 10 rows in one transaction in the
    middle, so that neither the oldest rows nor the newest 32 transactions are b's."""
    await conn.execute("TRUNCATE queue_message")
    for i in range(400):
        if i == 200:
            await _insert(conn, 10, "b" if keyed else None, "b")
        await _insert(conn, 50, "a" if keyed else None, "a")


async def test_fairness_key__a_tenant_behind_anothers_burst_goes_in_the_first_claims(
    db: str,
) -> None:
    async with pg_session(db) as conn:
        await _burst_with_a_quiet_tenant_inside(conn, keyed=False)
        without = await _claims_until(conn, "b", FairKeyCursor(), 60)
        await _burst_with_a_quiet_tenant_inside(conn, keyed=True)
        with_keys = await _claims_until(conn, "b", FairKeyCursor(), 60)
    # A share of 500 / 64 = 7 rows per key and claim: b's 10 rows take two claims.
    assert with_keys <= 2, f"b's rows took {with_keys} claims with fairness keys"
    # Without keys, b waits for about half of a's 20,000 rows, ahead of it in seq order.
    assert without >= 10, f"b's rows took only {without} claims without fairness keys"


async def test_fairness_key__the_next_claim_goes_on_after_the_last_key_served(db: str) -> None:
    async with pg_session(db) as conn:
        await conn.execute("TRUNCATE queue_message")
        names = [f"k{i:02}" for i in range(40)]
        # One transaction (the transactions' round then takes 7 rows of it): 100 rows a key,
        # hand-written as above.
        await conn.execute(
            "INSERT INTO queue_message (exchange, routing_key, content, fairness_key) "
            "SELECT 'x', 'rk', jsonb_build_object('g', g), k "
            "FROM unnest($1::text[]) AS k, generate_series(1, 100) AS g ORDER BY k, g", names)
        cursor = FairKeyCursor()
        served = []
        for _ in range(2):
            async with conn.transaction():
                start = cursor.start
                records = await conn.fetch(CLAIM, BATCH, 16, False, NO_BYTE_LIMIT, FROM_START,
                                           False, None, MAX_MESSAGE, start, FROM_START, False)
                keys = [r["fair_key"] for r in records if r["fair_key"] is not None]
                cursor.served(start, keys)
                served.append(set(keys))
                await conn.execute("DELETE FROM queue_message WHERE seq = ANY($1::bigint[])",
                                   [r["seq"] for r in records])
    # One claim visits 32 keys (LEAST(32, room / share)): the first 32 in text order...
    assert served[0] == set(names[:32]), sorted(served[0])
    # ...and the next one those it left, before it comes round to the first ones again.
    assert set(names[32:]) <= served[1], sorted(served[1])
    assert len(served[1]) == 32, sorted(served[1])


def test_fair_key_cursor__goes_on_after_the_last_key_in_the_order_the_round_visits() -> None:
    cursor = FairKeyCursor()
    cursor.served(None, ["b", "a", "c"])
    assert cursor.start == "c"
    cursor.served("c", ["d", "e", "a", "b"])  # after c: d, e; round to the beginning: a, b
    assert cursor.start == "b"
    cursor.served("b", ["c", "d"])  # nothing up to b again: the last is d
    assert cursor.start == "d"
    cursor.served("d", [])  # no key served: where it was
    assert cursor.start == "d"
