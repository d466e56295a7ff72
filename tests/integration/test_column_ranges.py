"""Every column a producer can write has a meaning for its whole range: extreme attempts, and
infinite available_at and created_at, neither break the settle nor the wake-up (real servers)."""

from __future__ import annotations

import asyncio
import json
import time

from relay.app import database_config
from relay.supervise import DOWN_EVENTS as CONNECTION_DOWN_EVENTS
from tests.helpers import Env, count_rows, pg_fetch, pg_fetchval, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows


async def _insert_with(env: Env, column: str, value: str, body: object,
                       exchange: str | None = None) -> str:
    """A row with one column set by hand (a hand-written INSERT: the column's range is the
    subject)."""
    return str(await pg_fetchval(
        env.pg_dsn, f"INSERT INTO queue_message (exchange, routing_key, content, {column}) "
        f"VALUES ($1, $2, $3::jsonb, $4::text::{_type(column)}) RETURNING id::text",
        exchange or env.exchange, env.routing_key, json.dumps(body), value))


def _type(column: str) -> str:
    return "integer" if column == "attempts" else "timestamptz"


async def _dead(env: Env) -> dict[str, tuple[int, str]]:
    rows = await pg_fetch(env.pg_dsn, "SELECT id::text, attempts, reason FROM queue_message_dead")
    return {r["id"]: (r["attempts"], r["reason"]) for r in rows}


async def test_extreme_attempts__the_failing_row_is_settled_and_good_rows_flow_once(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """attempts = 2147483647 overflowed `attempts + 1` and rolled back the whole settle (acked
    rows included): the batch was published again and again."""
    good = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(20))
    at_max = await _insert_with(env, "attempts", "2147483647", {"max": 1}, "no-such-exchange")
    negative = await _insert_with(env, "attempts", "-2147483648", {"neg": 1}, "no-such-exchange")
    later = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, range(20))
    relay = start_relay(max_attempts=3, retry_base_s=0.05, retry_max_s=0.1)
    await consumer.wait_for(40)
    await wait_until(lambda: _has_dead(env, {at_max, negative}), what="both failing rows dead")
    dead = await _dead(env)
    assert dead[at_max][0] == 2147483647
    assert dead[at_max][1].startswith("gave up after 2147483647 attempts: exchange_not_found")
    # A negative count reads as none made: the row got its full three attempts.
    assert dead[negative][0] == 3
    await asyncio.sleep(1.0)  # any re-publication of the acked rows would show now
    assert sorted(set(consumer.ids)) == sorted(good + later)
    assert consumer.duplicates() == 0
    assert await count_rows(env.pg_dsn) == 0
    assert relay.alive()


async def _has_dead(env: Env, ids: set[str]) -> bool:
    return ids <= set(await _dead(env))


async def _commits(env: Env) -> int:
    return int(await pg_fetchval(
        env.pg_dsn, "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"))


async def test_available_at_infinity__an_idle_relay_stays_idle_and_later_rows_flow(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """`infinity - now()` is an error on PostgreSQL 15: the wake-up check failed and the relays
    looped without a pause (about 1,500 transactions a second on an idle table)."""
    never = await _insert_with(env, "available_at", "infinity", {"never": 1})
    relay = start_relay()
    first = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [1])
    await consumer.wait_for(1)
    await asyncio.sleep(1.0)  # settle into sleep
    before, started = await _commits(env), time.monotonic()
    await asyncio.sleep(5.0)
    rate = (await _commits(env) - before) / (time.monotonic() - started)
    # The statistics are flushed about once a second; a few wake-ups and polls are fine.
    assert rate < 20, f"an idle relay ran {rate:.0f} transactions a second"
    later = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [2])
    await consumer.wait_for(2, timeout_s=5)
    assert sorted(consumer.ids) == sorted(first + later)
    assert await pg_fetchval(
        env.pg_dsn, "SELECT count(*) FROM queue_message WHERE id = $1", never) == 1
    assert not [e for e in relay.log_events()
                if e.get("connection") == "wakeup" and e.get("event") in CONNECTION_DOWN_EVENTS]
    assert relay.alive()


async def test_infinite_created_at__delivered_and_status_still_reports(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """created_at is producer-writable too: `now() - created_at` failed the backlog query."""
    past = await _insert_with(env, "created_at", "-infinity", {"past": 1})
    future = await _insert_with(env, "created_at", "infinity", {"future": 1})
    now_due = await _insert_with(env, "available_at", "-infinity", {"due": 1})
    from relay.pg.store import Outbox
    from relay.settings import Settings

    outbox = await Outbox.open(database_config(Settings(pg_dsn=env.pg_dsn, amqp_url=env.amqp_url)))
    try:
        backlog = await outbox.backlog()
    finally:
        await outbox.close()
    assert backlog["due"] == 3
    assert 0 <= backlog["oldest_due_age_s"] <= 3155760000
    start_relay()
    await consumer.wait_for(3)
    assert sorted(consumer.ids) == sorted([past, future, now_due])
