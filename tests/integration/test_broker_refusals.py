"""Refusals the encoder cannot foresee (an internal exchange, an exchange the relay's user may
not write to) cost no other message: no duplicate, no good row blamed, among many good rows
published by two relays of three lanes (real servers)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import aio_pika
import pytest

from tests.chaos.harness import broker_user, rabbitmqctl
from tests.helpers import Env, count_rows, dead_reasons, pg_session, wait_until, with_user
from tests.kit.consumer import Consumer


@pytest.fixture
def limited_user() -> Iterator[tuple[str, str]]:
    """A broker user that may write to every exchange except those named forbidden-*."""
    with broker_user("relay_lim", write="^(?!forbidden-).*") as user:
        yield user


async def test_refused_destinations__parked_alone_no_duplicate_no_good_row_blamed(
    env: Env, consumer: Consumer, start_relay, limited_user: tuple[str, str]
) -> None:
    """Three such rows among 900 good ones: each was parked, but 400 good rows were
    delivered twice (a channel close lost the confirms of every lane's messages)."""
    forbidden = f"forbidden-{env.exchange}"
    conn = await aio_pika.connect(env.amqp_url)
    try:
        channel = await conn.channel()
        exchange = await channel.declare_exchange(forbidden, auto_delete=True)
        queue = await channel.get_queue(env.queue)
        await queue.bind(exchange, routing_key="rk")
    finally:
        await conn.close()
    rows = [(env.exchange, env.routing_key, {"good": i}) for i in range(900)]
    for at, target in ((150, "amq.rabbitmq.trace"), (450, forbidden), (750, "amq.rabbitmq.trace")):
        rows.insert(at, (target, "rk", {"refused": at}))
    ids = await _insert(env.pg_dsn, rows)
    refused = {row_id for row_id, row in zip(ids, rows, strict=True) if row[0] != env.exchange}
    assert len(refused) == 3
    url = with_user(env.amqp_url, *limited_user)
    relays = [start_relay(amqp_url=url, concurrency=3, max_attempts=1) for _ in range(2)]
    await consumer.wait_for(900, timeout_s=60)
    await wait_until(lambda: _empty(env), what="every row settled")
    receipts = Counter(consumer.ids)
    assert set(receipts) == set(ids) - refused
    assert max(receipts.values()) == 1, [k for k, n in receipts.items() if n > 1][:5]
    dead = await dead_reasons(env.pg_dsn)
    assert set(dead) == refused, dead
    assert all("ACCESS_REFUSED" in reason for reason in dead.values()), dead
    assert all(relay.alive() for relay in relays)


LANES, BATCH = 3, 50


async def test_refused_routing_key__only_its_rows_are_parked_the_exchange_flows(
    env: Env, consumer: Consumer, start_relay,
) -> None:
    """RabbitMQ's topic permissions refuse some routing keys of a topic exchange: their rows
    are parked, the exchange's other routing keys are delivered. Every ACCESS_REFUSED marked
    the whole exchange refused, and its good rows were parked with it. A denied routing key on
    an exchange already proven closes a relay's shared channel (its unconfirmed messages go
    again: duplicates), once per exchange: from then on each routing key of it is proven on
    the probe channel, so the duplicates stay within one shared channel's messages in flight
    per relay (lanes x batch size)."""
    topic = f"topic-{env.exchange}"
    conn = await aio_pika.connect(env.amqp_url)
    try:
        channel = await conn.channel()
        exchange = await channel.declare_exchange(topic, aio_pika.ExchangeType.TOPIC,
                                                  auto_delete=True)
        await (await channel.get_queue(env.queue)).bind(exchange, routing_key="#")
    finally:
        await conn.close()
    rows = [(topic, f"ok.{i % 7}", {"good": i}) for i in range(600)]
    for at in (100, 300, 500):
        rows.insert(at, (topic, f"denied.{at}", {"denied": at}))
    with broker_user("relay_topic") as user:
        rabbitmqctl("set_topic_permissions", "-p", "/", user[0], topic, "^ok\\.", ".*")
        ids = await _insert(env.pg_dsn, rows)
        denied = {row_id for row_id, row in zip(ids, rows, strict=True)
                  if row[1].startswith("denied")}
        url = with_user(env.amqp_url, *user)
        relays = [start_relay(amqp_url=url, concurrency=LANES, batch_size=BATCH,
                              max_attempts=1) for _ in range(2)]
        await consumer.wait_for(600, timeout_s=60)
        await wait_until(lambda: _empty(env), what="every row settled")
    receipts = Counter(consumer.ids)
    assert set(receipts) == set(ids) - denied
    duplicates = sum(n - 1 for n in receipts.values())
    print(f"\n[refusals] 3 denied routing keys among 600 rows, 2 relays: {duplicates} duplicates")
    assert duplicates <= 2 * LANES * BATCH
    dead = await dead_reasons(env.pg_dsn)
    assert set(dead) == denied, dead
    assert all("access to topic 'denied." in reason for reason in dead.values()), dead
    assert all(relay.alive() for relay in relays)


async def _insert(dsn: str, rows: list[tuple[str, str, dict[str, int]]]) -> list[str]:
    """Rows of (exchange, routing key, body) in one statement, in order; their ids. (The rows'
    exchanges and keys are the subject here, so the INSERT names them one by one.)"""
    async with pg_session(dsn) as db:
        return [r[0] for r in await db.fetch(
            "INSERT INTO queue_message (exchange, routing_key, content) "
            "SELECT * FROM unnest($1::text[], $2::text[], $3::jsonb[]) RETURNING id::text",
            [r[0] for r in rows], [r[1] for r in rows], [json.dumps(r[2]) for r in rows])]


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0
