"""Plans that cannot go cold: every statement on the claim and settle path reads a bounded part
of the table, whatever its statistics say. The hazard: autovacuum after a quiet spell records a
drained outbox as empty (`reltuples` 0); a relay's cached plans, made against that, scanned
and sorted the whole bulk that came next on every claim, until the next ANALYZE (one claim of
500 rows from 100,000 read 400,016 rows, 0.48 s, instead of 651). The relay's claiming
sessions plan by the indexes (relay/pg/connection.py, PLANS_BY_INDEX). When autovacuum could
not truncate the table, its pages stay and every plan expects no rows, fresh or cached: then
the relay has the table analyzed when its claims go from short to full (relay/pg/tablestats.py).

Each test empties and vacuums the table, runs the statements on the (nearly) empty table, long
enough for the server to settle on generic plans, commits a bulk, and then counts the rows each
statement reads (this transaction's own table statistics)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from relay.app import database_config
from relay.pg.connection import connect_args
from relay.pg.seqfloor import FROM_START
from relay.pg.store import Outbox, SingleActiveWalk
from relay.settings import Settings
from tests.helpers import pg_session
from tests.kit.producer import fresh_ids, insert_rows
from tests.kit.stream import STREAM_TABLE

BULK = 50_000
LIMIT = 500
KEYS_PER_BATCH = 16
MAX_BYTES = 1 << 20
MAX_MESSAGE = 16 << 20
# Rows one statement of a batch of 500 may read: the claim's bounded walks (its fair round,
# the fill, the keyed walks) with room to spare; a plan that scans reads the whole bulk, and a
# plan that scans and sorts in several parts of the claim reads it several times.
READ_BOUND = 5_000
# The server settles on a generic plan after five executions (plan_cache_mode auto).
WARM_UP = 8


def _read(table: str) -> str:
    return ("SELECT COALESCE(sum(idx_tup_fetch), 0) + COALESCE(sum(seq_tup_read), 0) "
            f"FROM pg_stat_xact_user_tables WHERE relid = '{table}'::regclass")


async def _rows_read(conn: asyncpg.Connection, table: str, sql: str, *args: Any) -> int:
    """Rows of `table` the statement read, in a transaction rolled back at once."""
    tx = conn.transaction()
    await tx.start()
    try:
        before = await conn.fetchval(_read(table))
        await conn.fetch(sql, *args)
        after = await conn.fetchval(_read(table))
    finally:
        await tx.rollback()
    return int(after - before)


async def _relay_session(dsn: str, role: str) -> asyncpg.Connection:
    """A session as the relay opens it for `role` (its settings, its statement cache)."""
    db = database_config(Settings(pg_dsn=dsn))
    return await asyncpg.connect(**connect_args(db, role))


async def _emptied_and_vacuumed(dsn: str, table: str) -> None:
    async with pg_session(dsn) as conn:
        await conn.execute(f"DELETE FROM {table}")
        await conn.execute(f"VACUUM ANALYZE {table}")


async def _stats_say_empty(conn: asyncpg.Connection, table: str) -> bool:
    return bool(await conn.fetchval(
        "SELECT reltuples <= 0 FROM pg_class WHERE oid = $1::regclass", table))


def _outbox_statements(db: Any, ids: list[str]) -> dict[str, tuple[str, tuple[Any, ...]]]:
    q = db.queries
    walk = SingleActiveWalk()
    return {
        "claim (unkeyed first)": (q["claim"], (LIMIT, KEYS_PER_BATCH, False, MAX_BYTES,
                                               FROM_START, False, None, MAX_MESSAGE, None,
                                               FROM_START, False)),
        "claim (keyed first)": (q["claim"], (LIMIT, KEYS_PER_BATCH, False, MAX_BYTES,
                                             FROM_START, True, None, MAX_MESSAGE, None,
                                             FROM_START, False)),
        "claim_express": (q["claim_express"], (LIMIT, MAX_BYTES, FROM_START, None,
                                               MAX_MESSAGE)),
        "claim_single_active": (q["claim_single_active"], (LIMIT, False, MAX_BYTES, MAX_MESSAGE,
                                                           walk.start(), walk.window(LIMIT))),
        "delete_published": (q["delete_published"], (ids,)),
        "archive_published": (q["archive_published"], (ids,)),
    }


async def test_cold_plans__after_an_emptied_outbox_is_vacuumed_a_bulk_is_claimed_by_index(
    db: str,
) -> None:
    config = database_config(Settings(pg_dsn=db))
    await _emptied_and_vacuumed(db, "queue_message")
    relay = await _relay_session(db, "worker")
    try:
        statements = _outbox_statements(config, fresh_ids(LIMIT))
        for _ in range(WARM_UP):
            for sql, args in statements.values():
                await _rows_read(relay, "queue_message", sql, *args)
        async with pg_session(db) as producer:
            ids = await insert_rows(producer, "x", "rk",
                                    ({"g": g, "pad": "x" * 100} for g in range(BULK)))
            assert await _stats_say_empty(producer, "queue_message"), "the test's premise"
        statements = _outbox_statements(config, ids[:LIMIT])
        read = {name: await _rows_read(relay, "queue_message", sql, *args)
                for name, (sql, args) in statements.items()}
        print(f"\n[cold plans] rows read after a {BULK:,}-row bulk: {json.dumps(read)}")
        assert all(n <= READ_BOUND for n in read.values()), (
            f"a statement read more than {READ_BOUND:,} of {BULK:,} rows: {read}")
        rows = await relay.fetch(*_claim(config))
        assert len(rows) == LIMIT, "the claim still takes a full batch"
        # The fill above the relays' shared frontier or not; the plan for these values, and
        # the generic one the server keeps after five runs.
        for shared, mode in [(s, m) for s in (False, True) for m in ("auto", "force_generic_plan")]:
            await relay.execute(f"SET plan_cache_mode = {mode}")
            plan = json.dumps(await (await relay.prepare(_claim(config)[0])).explain(
                *_claim(config, shared)[1:]))
            assert "Seq Scan" not in plan, (shared, mode, plan)
            assert "Bitmap Heap Scan" not in plan, (shared, mode, plan)
            # A plan priced past jit_above_cost was compiled at every run (0.64 s).
            assert '"JIT"' not in plan, (shared, mode, plan)
    finally:
        await relay.close()


def _claim(db: Any, shared: bool = False) -> tuple[Any, ...]:
    return (db.queries["claim"], LIMIT, KEYS_PER_BATCH, False, MAX_BYTES, FROM_START, False,
            None, MAX_MESSAGE, None, FROM_START, shared)


async def test_cold_plans__a_stream_bulk_after_a_vacuum_is_given_to_slots_by_index(
    db: str,
) -> None:
    config = database_config(Settings(pg_dsn=db))
    q = config.queries
    await _emptied_and_vacuumed(db, STREAM_TABLE)
    relay = await _relay_session(db, "streams")
    statements = {
        "stream_unsynced": (q["stream_unsynced"], (LIMIT, [])),
        "stream_assigned": (q["stream_assigned"], (0, LIMIT)),
    }
    try:
        for _ in range(WARM_UP):
            for sql, args in statements.values():
                await _rows_read(relay, STREAM_TABLE, sql, *args)
        async with pg_session(db) as producer:
            await producer.execute(
                f"INSERT INTO {STREAM_TABLE} (stream, content) "
                "SELECT 's' || (g % 4), jsonb_build_object('n', g, 'pad', repeat('x', 100)) "
                "FROM generate_series(1, $1) AS g", BULK)
            assert await _stats_say_empty(producer, STREAM_TABLE), "the test's premise"
        read = {name: await _rows_read(relay, STREAM_TABLE, sql, *args)
                for name, (sql, args) in statements.items()}
        print(f"\n[cold plans] stream rows read after a {BULK:,}-row bulk: {json.dumps(read)}")
        assert all(n <= READ_BOUND for n in read.values()), (
            f"a statement read more than {READ_BOUND:,} of {BULK:,} rows: {read}")
    finally:
        await relay.close()


async def _table_stats(conn: asyncpg.Connection) -> tuple[int, float]:
    row = await conn.fetchrow("SELECT relpages, reltuples FROM pg_class "
                              "WHERE oid = 'queue_message'::regclass")
    return int(row["relpages"]), float(row["reltuples"])


async def test_cold_plans__statistics_that_count_no_rows_are_refreshed_when_a_backlog_begins(
    db: str,
) -> None:
    """Autovacuum that could not truncate the emptied table (sessions were using it) leaves its
    pages and `reltuples` 0: every plan then expects no rows (the express lane's look at the
    newest transaction, a plain statement planned once per session, too). The relay's first
    full claim after short ones has the table analyzed once its batch is done, and the claims
    read a batch's rows again, not the whole bulk."""
    config = database_config(Settings(pg_dsn=db))
    async with pg_session(db) as producer:
        await insert_rows(producer, "x", "rk", ({"g": g} for g in range(2_000)))
        await producer.execute("ANALYZE queue_message")
        await producer.execute("DELETE FROM queue_message")
        await producer.execute("VACUUM (ANALYZE, TRUNCATE false) queue_message")
        pages, tuples = await _table_stats(producer)
        assert (pages > 0, tuples) == (True, 0.0), "the test's premise: pages kept, no rows"
    outbox = await Outbox.open(config)
    relay = await _relay_session(db, "worker")
    try:
        await insert_rows(db, "x", "rk", [{"live": 1}])
        for _ in range(WARM_UP):
            async with outbox.claim(LIMIT) as batch:
                assert len(batch.rows) == 1  # short: rolled back, claimed again
        await insert_rows(db, "x", "rk", ({"g": g, "pad": "x" * 100} for g in range(BULK)))
        cold = await _rows_read(relay, "queue_message", *_claim(config))
        assert cold >= BULK, f"the test's premise: a claim read only {cold} rows"
        # The express lane's look, planned now: its plan is made again after the refresh.
        newest = config.queries["newest_transaction"]
        await _rows_read(relay, "queue_message", newest, "0")
        async with outbox.claim(LIMIT) as batch:  # the first full claim, with the plans as
            assert len(batch.rows) == LIMIT        # they are, has the table analyzed after it
            assert outbox.statistics.refreshed == 0
        assert outbox.statistics.refreshed == 1, "the table was analyzed after the claim"
        async with pg_session(db) as check:
            assert (await _table_stats(check))[1] >= BULK / 2
        warm = await _rows_read(relay, "queue_message", *_claim(config))
        print(f"\n[cold plans] rows a claim read: {cold:,} before the refresh, {warm:,} after")
        assert warm <= READ_BOUND
        assert await _rows_read(relay, "queue_message", newest, "0") <= READ_BOUND
        # A trickle of short claims, then full ones again: no second ANALYZE (the statistics
        # count the rows now).
        async with outbox.claim(LIMIT) as batch:
            assert len(batch.rows) == LIMIT
        assert outbox.statistics.refreshed == 1
    finally:
        await relay.close()
        await outbox.close()
