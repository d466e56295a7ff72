"""Recurring rows (docs/recurring.md) against the real servers: a row repeating every second is
published again and again and stays in the outbox, its occurrences archived; the table refuses
an expression it cannot read at INSERT, saying what is wrong; a row whose schedule has no next
time is parked with the reason; an outage that missed occurrences publishes one catch-up."""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime

import aio_pika
import asyncpg
import pytest

from tests.helpers import (
    Env,
    count_rows,
    pg_fetch,
    pg_fetchrow,
    pg_fetchval,
    pg_session,
    wait_until,
)
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows


async def test_recurring__every_second_delivered_again_a_second_apart_and_kept(
    env: Env, consumer: Consumer, start_relay
) -> None:
    [row_id] = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"tick": 1}],
                                 repeat="PT1S")
    relay = start_relay(on_success="archive", poll_interval_s=0.2)
    await wait_until(lambda: len(consumer.ids) >= 3, timeout_s=15,
                     what="three occurrences of a row repeating every second")
    assert consumer.ids[:3] == [row_id] * 3, "every occurrence carries the row's id"
    occurrences = [m.headers["x-outbox-occurrence"] for m in consumer.messages[:3]]
    assert len(set(occurrences)) == 3, occurrences
    # The first occurrence goes once the relay runs, the next two a second apart each: never
    # sooner (how much later is the load's; 15 s bounds it above).
    due = [datetime.fromisoformat(o) for o in occurrences]
    assert [(b - a).total_seconds() >= 1.0 for a, b in itertools.pairwise(due)] == [True, True], due
    row = await pg_fetchrow(env.pg_dsn, "SELECT attempts, repeat, available_at > now() AS later "
                            "FROM queue_message WHERE id = $1", row_id)
    assert row is not None, "a recurring row is never deleted"
    assert (row["attempts"], row["repeat"]) == (0, "PT1S")
    seqs = {r["seq"] for r in await pg_fetch(env.pg_dsn, "SELECT seq FROM queue_message")}
    archived = await pg_fetch(env.pg_dsn, "SELECT id::text, seq FROM queue_message_archive")
    assert len(archived) >= 3, archived
    assert {r["seq"] for r in archived} == seqs, "an occurrence is archived with the row's seq"
    assert row_id not in {r["id"] for r in archived}, "each occurrence has an id of its own"
    # Deleting the row stops it (an occurrence published just before may still arrive).
    await pg_fetch(env.pg_dsn, "DELETE FROM queue_message WHERE id = $1 RETURNING 1", row_id)
    assert await arrivals_within(consumer, 2.5) <= 1
    assert await count_rows(env.pg_dsn) == 0
    assert relay.alive()


async def arrivals_within(consumer: Consumer, seconds: float) -> int:
    """How many messages arrive in the next `seconds`."""
    seen = len(consumer.ids)
    await asyncio.sleep(seconds)
    return len(consumer.ids) - seen


async def test_recurring__an_interval_in_lower_case_with_blanks_is_rescheduled(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """The table accepts ' pt1s ' (it reads the value in upper case, blanks trimmed); the
    settle cast it as written, failed, and rolled the batch back: published again at once,
    for ever. Found by tests/property/test_recurring_property.py."""
    [row_id] = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{}],
                                 repeat=" pt1s ")
    start_relay(poll_interval_s=0.2)
    await wait_until(lambda: len(consumer.ids) >= 2, timeout_s=10, what="two occurrences")
    await asyncio.sleep(1.5)
    assert 2 <= len(consumer.ids) <= 4, f"{len(consumer.ids)} occurrences in about 3 s"
    row = await pg_fetchrow(env.pg_dsn, "SELECT attempts FROM queue_message WHERE id = $1",
                            row_id)
    assert row is not None
    assert row["attempts"] == 0


@pytest.mark.parametrize(("repeat", "says"), [
    ("61 * * * *", "bad minute: 61"),
    ("0 0 31 2 *", "bad day of month"),
    ("* * * *", "five fields, or six"),
    ("PT0.5S", "at least one second"),
    ("PT-5S", "ISO 8601 interval"),
    ("every minute", "five fields, or six"),
    ("* * * * ſun", "printable ASCII"),
])
async def test_recurring__an_expression_the_table_cannot_read_is_refused_at_insert(
    env: Env, repeat: str, says: str
) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match=says) as exc:
        await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{}], repeat=repeat)
    assert "repeat" in str(exc.value)
    assert await count_rows(env.pg_dsn) == 0


async def test_recurring__a_row_with_an_ordering_key_cannot_repeat(env: Env) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="repeat_unkeyed"):
        await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{}], repeat="PT1S",
                          ordering_keys="k")


async def test_recurring__a_schedule_without_a_next_time_is_parked_with_its_reason(
    env: Env, consumer: Consumer, start_relay
) -> None:
    # Day 1 or 21 and the last Monday of the month: never both (the table reads it; there is
    # no time to schedule it at).
    [never] = await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"n": 1}],
                                repeat="* * */20 * 1L")
    start_relay()
    await consumer.wait_for(1)
    await wait_until(lambda: _dead(env), what="the row parked")
    dead = await pg_fetchrow(env.pg_dsn, "SELECT id::text, reason, repeat FROM queue_message_dead")
    assert dead is not None
    assert dead["id"] == never
    assert dead["reason"].startswith("invalid_repeat: ")
    assert "50 years" in dead["reason"]
    assert dead["repeat"] == "* * */20 * 1L", "a parked row keeps its schedule for replay"


async def _dead(env: Env) -> bool:
    return await count_rows(env.pg_dsn, "queue_message_dead") == 1


async def test_recurring__missed_occurrences_publish_one_catch_up_then_the_schedule_goes_on(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """Due every minute since an hour ago (a relay was down): one message, not sixty, and the
    row's next time is the next minute from now."""
    async with pg_session(env.pg_dsn) as conn:
        [row_id] = await insert_rows(conn, env.exchange, env.routing_key, [{}],
                                     repeat="* * * * *", delay_s=-3600)
        before = await conn.fetchval("SELECT now()")
    start_relay(poll_interval_s=0.2)
    await consumer.wait_for(1)
    await wait_until(lambda: _rescheduled(env, row_id), what="the row rescheduled")
    row = await pg_fetchrow(env.pg_dsn, "SELECT available_at, EXTRACT(EPOCH FROM "
                            "available_at - now())::float8 AS due_in_s FROM queue_message")
    assert row is not None
    # No other message until the next occurrence: watched for 2 s, or until just before that
    # occurrence when it comes sooner (a catch-up published in a minute's last seconds).
    assert await arrivals_within(consumer, max(0.0, min(2.0, row["due_in_s"] - 0.2))) == 0
    assert consumer.ids == [row_id]
    assert row["available_at"] > before
    assert row["available_at"].second == 0
    assert (row["available_at"] - before).total_seconds() <= 61


async def _rescheduled(env: Env, row_id: str) -> bool:
    return bool(await pg_fetch(env.pg_dsn, "SELECT 1 FROM queue_message WHERE id = $1 "
                               "AND available_at > now()", row_id))


async def test_recurring__status_counts_recurring_rows(env: Env) -> None:
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{}] * 2, repeat="0 * * * *",
                      delay_s=60)
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{}] * 3)
    from relay.pg.queries import Queries, TableNames
    q = Queries(TableNames(None, "queue_message", "queue_message_notify"))
    row = await pg_fetchrow(env.pg_dsn, q["backlog"])
    assert row is not None
    assert row["recurring"] == 2


async def test_recurring__a_retried_occurrence_keeps_the_time_it_was_due(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """An occurrence that cannot go at once (here unroutable: no queue bound to its key yet) is
    retried later and goes with the occurrence it first went out as, not the time of its retry:
    an inbox tells occurrences apart by it, and a postponed occurrence under a new time would
    run its handler twice. Once it went, the next occurrence is the schedule's again."""
    [row_id] = await insert_rows(env.pg_dsn, env.exchange, "bound-later", [{"tick": 1}],
                                 repeat="PT1H")
    due = await pg_fetchval(env.pg_dsn, "SELECT available_at FROM queue_message WHERE id = $1",
                            row_id)
    start_relay(retry_base_s=0.5, poll_interval_s=0.2)
    await wait_until(lambda: _retried(env, row_id), timeout_s=30,
                     what="the unroutable occurrence retried")
    conn = await aio_pika.connect(env.amqp_url)
    try:
        channel = await conn.channel()
        queue = await channel.get_queue(env.queue)
        await queue.bind(env.exchange, "bound-later")
    finally:
        await conn.close()
    await wait_until(lambda: _arrived(consumer), timeout_s=30, what="the occurrence delivered")
    sent = datetime.fromisoformat(consumer.messages[0].headers["x-outbox-occurrence"])
    assert abs((sent - due).total_seconds()) < 0.001, (sent, due)
    row = await pg_fetchrow(env.pg_dsn, "SELECT occurrence_at, available_at > now() + "
                            "interval '50 minutes' AS next_hour FROM queue_message WHERE id = $1",
                            row_id)
    assert row is not None
    assert (row["occurrence_at"], row["next_hour"]) == (None, True)


async def _retried(env: Env, row_id: str) -> bool:
    return bool(await pg_fetchval(env.pg_dsn, "SELECT attempts >= 1 AND occurrence_at IS NOT "
                                  "NULL FROM queue_message WHERE id = $1", row_id))


async def _arrived(consumer: Consumer) -> bool:
    return len(consumer.ids) >= 1
