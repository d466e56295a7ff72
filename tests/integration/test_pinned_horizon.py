"""A claim that stays cheap when the database cannot clean up (real servers).

A transaction elsewhere in the database (here a REPEATABLE READ snapshot) pins the xmin
horizon: every row the relay deletes stays in the `seq` index. The unkeyed claim starts above
the rows already moved (relay/pg/seqfloor.py), and its sweeps still find what turns up below.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from relay.app import database_config
from relay.pg.queries import Queries
from relay.pg.seqfloor import FROM_START
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.conftest import NAMES
from tests.helpers import Env, count_rows, pg_session, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows


@pytest.fixture
async def pinned(env: Env) -> AsyncIterator[asyncpg.Connection]:
    """A session whose snapshot holds the database's xmin horizon for the whole test."""
    async with pg_session(env.pg_dsn) as conn:
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await conn.fetchval("SELECT count(*) FROM queue_message")
        yield conn


async def _index_entries_read(conn: asyncpg.Connection, sql: str, *args: Any) -> int:
    """Index entries of the outbox that one run of `sql` reads (the server's own count for
    the current transaction, which is rolled back: the claim's locks end with it)."""
    count = ("SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index "
             "WHERE indrelid = 'queue_message'::regclass")
    tx = conn.transaction()
    await tx.start()
    try:
        before = await conn.fetchval(count)
        rows = await conn.fetch(sql, *args)
        assert len(rows) == 500
        return int(await conn.fetchval(count)) - int(before)
    finally:
        await tx.rollback()


async def test_with_the_horizon_pinned__a_floored_claim_steps_over_none_of_the_deleted_rows(
    env: Env, pinned: asyncpg.Connection
) -> None:
    """The floor is an index bound: the claim from the floor reads its 500 rows' entries, the
    claim from the bottom every deleted row's entry (and its heap tuple) as well."""
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, ({"n": i} for i in range(30_000)))
    async with pg_session(env.pg_dsn) as conn:
        await conn.execute("ANALYZE queue_message")
        live_from = await conn.fetchval(
            "SELECT seq FROM queue_message ORDER BY seq OFFSET 29500 LIMIT 1")
        await conn.execute("DELETE FROM queue_message WHERE seq < $1", live_from)
        claim = Queries(NAMES)["claim"]
        bottom = await _index_entries_read(conn, claim, 500, 16, False, 24 << 20, FROM_START, False,
                                            None, 16 << 20, None, FROM_START, False)
        floored = await _index_entries_read(conn, claim, 500, 16, False, 24 << 20, live_from,
                                            False, None, 16 << 20, None, live_from, False)
    assert floored <= 1_000, (floored, bottom)
    assert bottom >= 29_500, (floored, bottom)


async def test_with_the_horizon_pinned__rows_below_the_floor_are_found_by_the_sweeps(
    env: Env, consumer: Consumer, start_relay, pinned: asyncpg.Connection
) -> None:
    """A producer transaction that took its seq early and commits while the relay is busy far
    above it (floored claims), and one that commits when the relay is idle: both delivered,
    within the sweep period, nothing twice."""
    async with pg_session(env.pg_dsn) as late, pg_session(env.pg_dsn) as late_idle:
        ids = []
        for conn in (late, late_idle):
            await conn.execute("BEGIN")
            ids += await insert_rows(conn, env.exchange, env.routing_key, [{"late": True}])
        relay = start_relay()
        flow: list[str] = []

        async def produce(limit_s: float) -> bool:
            """Rows in a flow until the late row arrived (True) or `limit_s` passed."""
            end = time.monotonic() + limit_s
            while time.monotonic() < end:
                if ids[0] in consumer.ids:
                    return True
                flow.extend(await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                                              ({"n": i} for i in range(200))))
                await asyncio.sleep(0.02)
            return False

        producer = asyncio.create_task(produce(60.0))
        await asyncio.sleep(2.5)  # the relay has followed the flow for more than its lag
        await late.execute("COMMIT")
        committed = time.monotonic()
        await wait_until(lambda: ids[0] in consumer.ids, timeout_s=30,
                         what="the row committed late below the floor, while the relay is busy")
        busy_s = time.monotonic() - committed
        assert await producer, "the late row arrived while the flow went on (the relay busy)"
        await consumer.wait_for(len(flow) + 1, timeout_s=30)
        await asyncio.sleep(1.5)  # idle now, its floor older than the lag
        await late_idle.execute("COMMIT")
        committed = time.monotonic()
        # The relay polls every 2 s (the tests' RELAY_POLL_INTERVAL_S): 10 s is 5 sweeps.
        await wait_until(lambda: ids[1] in consumer.ids, timeout_s=10,
                         what="the row committed late below the floor, to an idle relay")
        idle_s = time.monotonic() - committed
    print(f"late rows arrived {busy_s:.2f} s (busy) and {idle_s:.2f} s (idle) after commit")
    assert sorted(set(consumer.ids)) == sorted([*flow, *ids])
    assert consumer.duplicates() == 0
    assert await count_rows(env.pg_dsn) == 0
    assert relay.alive()


LIVE = 3_000


async def _index_entries(conn: asyncpg.Connection, sql: str, *args: Any) -> tuple[int, Any]:
    """Index entries of the outbox one run of `sql` read, and its first value (rolled back)."""
    count = ("SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid)) FROM pg_index "
             "WHERE indrelid = 'queue_message'::regclass")
    tx = conn.transaction()
    await tx.start()
    try:
        before = await conn.fetchval(count)
        value = await conn.fetchval(sql, *args)
        return int(await conn.fetchval(count)) - int(before), value
    finally:
        await tx.rollback()


async def test_with_the_horizon_pinned__the_express_lanes_look_and_claim_read_only_what_is_new(
    env: Env, pinned: asyncpg.Connection
) -> None:
    """The express lane looks at the newest transaction every few milliseconds while a
    backlog drains, and claims what committed since. The live rows it claimed are deleted, but
    their index entries stay while the horizon is pinned, at the (xact, seq) index's end: a
    look without a bound, and a claim bounded only by the drain's start, walked every one of
    them. The look is bounded by the newest transaction the lane saw, its claims by the floor
    its bursts moved up (relay/loop/express.py): each reads only newer entries."""
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, ({"bulk": i} for i in range(500)))
    outbox = await Outbox.open(database_config(Settings(pg_dsn=env.pg_dsn)))
    try:
        express = outbox.express()
        async with pg_session(env.pg_dsn) as conn:
            express.after = int(await conn.fetchval("SELECT max(xact)::text FROM queue_message"))
            for i in range(LIVE):  # one-row transactions, claimed and deleted as they came
                await insert_rows(conn, env.exchange, env.routing_key, [{"live": i}])
            look = await express.newest_transaction()
            assert look.xact is not None
            live = [int(x) for x in await conn.fetchval(
                "SELECT array_agg(xact::text) FROM queue_message WHERE xact > $1::text::xid8",
                str(express.after))]
            await conn.execute("DELETE FROM queue_message WHERE xact > $1::text::xid8",
                               str(express.after))
            await conn.execute("ANALYZE queue_message")
            query = Queries(NAMES)["newest_transaction"]
            unbounded, _ = await _index_entries(conn, query, "0")
            bounded, none = await _index_entries(conn, query, str(look.xact))
            await insert_rows(conn, env.exchange, env.routing_key, [{"live": "new"}])
            bounded_new, found = await _index_entries(conn, query, str(look.xact))
            claim = Queries(NAMES)["claim_express"]
            from_start, _ = await _index_entries(conn, claim, 64, 24 << 20, FROM_START,
                                                 str(express.after), 16 << 20)
            # As a burst leaves it. Below a transaction that still runs anywhere on the server
            # (another test's, in a suite run): then the claim reads the entries above it.
            express.floor = min(look.xact, look.running_from - 1)
            above = sum(1 for x in live if x > express.floor)
            from_floor, _ = await _index_entries(conn, claim, 64, 24 << 20, FROM_START,
                                                 str(express.floor), 16 << 20)
            async with express.claim(64) as batch:
                assert [r.content for r in batch.rows] == [b'{"live": "new"}']
    finally:
        await outbox.close()
    print(f"\n[pinned] index entries read by a look: {unbounded:,} from the end, {bounded} above "
          f"the last transaction seen ({bounded_new} with one new row); by an express claim: "
          f"{from_start:,} from the drain's start, {from_floor} from the floor ({above} deleted "
          f"rows above it)")
    assert unbounded >= LIVE, "the test's premise: the deleted rows' entries are walked"
    assert from_start >= LIVE, "the test's premise: the deleted rows' entries are walked"
    assert none is None
    assert found is not None
    assert int(found) > look.xact
    assert bounded <= 5
    assert bounded_new <= 5
    assert from_floor <= above + 10
