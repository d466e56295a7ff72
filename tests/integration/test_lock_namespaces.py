"""The relay's advisory locks are keyed on the outbox table's oid, never on the spelling of
RELAY_TABLE: `queue_message` and `public.queue_message` name one table and share its locks; and
what reads locks back sees only its own database's, although a database cloned from another
has the same table oids."""

from __future__ import annotations

import asyncpg
import pytest

from relay.pg.queries import Queries, TableNames
from relay.pg.seqfloor import FROM_START
from tests.helpers import Env, RelayProcess, pg_session, wait_until
from tests.kit.producer import insert_rows

BARE = Queries(TableNames(None, "queue_message", "queue_message_notify"))
QUALIFIED = Queries(TableNames("public", "queue_message", "queue_message_notify"))


async def test_leader_lock__both_spellings_of_the_table_compete_for_one_lock(db: str) -> None:
    first, second = await asyncpg.connect(db), await asyncpg.connect(db)
    try:
        assert await first.fetchval(BARE["leader_try_lock"]) is True
        assert await second.fetchval(QUALIFIED["leader_try_lock"]) is False
        await first.close()
        assert await second.fetchval(QUALIFIED["leader_try_lock"]) is True
    finally:
        await first.close()
        await second.close()


async def test_fence__both_spellings_of_the_table_wait_for_one_lock(db: str) -> None:
    first, second = await asyncpg.connect(db), await asyncpg.connect(db)
    try:
        async with first.transaction():
            await first.execute(BARE["single_active_fence"])
            await second.execute("SET lock_timeout = '200ms'")
            with pytest.raises(asyncpg.LockNotAvailableError):
                async with second.transaction():
                    await second.execute(QUALIFIED["single_active_fence"])
    finally:
        await first.close()
        await second.close()


async def test_ordering_key_lock__is_keyed_on_the_table_oid(db: str) -> None:
    await insert_rows(db, "x", "rk", [1, 2])
    async with pg_session(db) as conn:
        await conn.execute("UPDATE queue_message SET ordering_key = 'k'")
        async with conn.transaction():
            rows = await conn.fetch(QUALIFIED["claim"], 10, 4, False, 1 << 30, FROM_START, True,
                                    None, 16 << 20, None, FROM_START, False)
            locks = await conn.fetch(
                "SELECT classid::bigint AS high, objid::bigint AS low FROM pg_locks "
                "WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid()")
            oid = await conn.fetchval("SELECT 'queue_message'::regclass::oid::bigint")
            key_hash = await conn.fetchval("SELECT hashtext('k')::bigint & 4294967295")
    assert len(rows) == 2
    assert [(r["high"], r["low"]) for r in locks] == [(oid, key_hash)]


async def test_single_active__relays_spelling_the_table_two_ways_elect_one_leader(
    env: Env, start_relay, relays: list[RelayProcess]
) -> None:
    bare = start_relay(mode="single-active", table="queue_message", leader_poll_interval_s=0.2)
    qualified = start_relay(mode="single-active", table="public.queue_message",
                            leader_poll_interval_s=0.2)

    def roles() -> list[str]:
        found = []
        for proc in (bare, qualified):
            events = {e.get("event") for e in proc.log_events()}
            found += [name for name in ("leader_elected", "standing_by") if name in events]
        return sorted(found)

    await wait_until(lambda: len(roles()) == 2, timeout_s=30, what="both relays to settle")
    assert roles() == ["leader_elected", "standing_by"]
    assert bare.terminate() == 0
    assert qualified.terminate() == 0


async def test_lock_readers__count_only_their_own_database_of_two_with_the_same_table_oid(
    db: str, other_db: str
) -> None:
    holder, mine, other = [await asyncpg.connect(d) for d in (db, db, other_db)]
    try:
        oids = [await c.fetchval("SELECT 'queue_message'::regclass::oid") for c in (mine, other)]
        assert oids[0] == oids[1]  # what made the two databases' locks mix
        assert (await holder.fetchrow(BARE["wakeup_try_sleep"]))["locked"] is True
        async with holder.transaction():
            await holder.execute("LOCK TABLE queue_message IN ACCESS SHARE MODE")
            assert await mine.fetchval(BARE["wakeup_sleepers"]) == 1
            assert [r["pid"] for r in await mine.fetch(BARE["outbox_lock_holders"])] == [
                holder.get_server_pid()]
            assert await other.fetchval(BARE["wakeup_sleepers"]) == 0
            assert await other.fetch(BARE["outbox_lock_holders"]) == []
    finally:
        for conn in (holder, mine, other):
            await conn.close()
