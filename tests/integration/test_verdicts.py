"""Rows that once stopped, lost or stormed the relay, each run through a real `relay run`
against the real servers among good rows: every row gets its verdict, good rows flow."""

from __future__ import annotations

import uuid
from typing import Any

from tests.helpers import (
    Env,
    count_rows,
    dead_reasons,
    pg_fetchrow,
    pg_fetchval,
    pg_session,
    wait_until,
)
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows


async def _insert(env: Env, rows: list[tuple[str, str, Any, dict[str, Any] | None]]) -> list[str]:
    """Insert (exchange, routing key, body, options) rows in one transaction; return ids."""
    async with pg_session(env.pg_dsn) as conn:
        ids = []
        async with conn.transaction():
            for exchange, key, body, options in rows:
                ids += await insert_rows(conn, exchange, key, [body], options=options)
        return ids


def _good(env: Env, n: int, tag: str) -> list[tuple[str, str, Any, None]]:
    return [(env.exchange, env.routing_key, {tag: i}, None) for i in range(n)]


async def test_millisecond_timestamp__is_converted_and_delivered_not_a_stuck_table(
    env: Env, consumer: Consumer, start_relay
) -> None:
    stamped_row = (env.exchange, env.routing_key, {"ms": 1}, {"timestamp": 1763900000000})
    ids = await _insert(env, [*_good(env, 3, "a"), stamped_row, *_good(env, 3, "b")])
    relay = start_relay()
    await consumer.wait_for(7)
    assert sorted(consumer.ids) == sorted(ids)
    stamped = next(m for m in consumer.messages if m.message_id == ids[3])
    assert stamped.timestamp is not None
    assert int(stamped.timestamp.timestamp()) == 1763900000
    await wait_until(lambda: _empty(env), what="an empty outbox")
    assert relay.alive()


async def test_message_id_equal_to_the_row_id__delivered_without_a_reconnect(
    env: Env, consumer: Consumer, start_relay
) -> None:
    row_id = str(uuid.uuid4())
    await insert_rows(env.pg_dsn, env.exchange, env.routing_key, [{"own": 1}], ids=[row_id],
                      options={"messageId": row_id})
    good = await _insert(env, _good(env, 5, "g"))
    relay = start_relay()
    await consumer.wait_for(6)
    assert sorted(consumer.ids) == sorted([row_id, *good])
    more = await _insert(env, _good(env, 5, "later"))
    await consumer.wait_for(11)
    assert set(more) <= set(consumer.ids)
    assert _connections_opened(relay.log_events()) == 1


async def test_routing_key_over_255_bytes__dead_at_once_naming_the_field(
    env: Env, consumer: Consumer, start_relay
) -> None:
    ids = await _insert(env, [*_good(env, 3, "a"), (env.exchange, "k" * 300, {"long": 1}, None),
                              *_good(env, 3, "b")])
    relay = start_relay()
    await consumer.wait_for(6)
    await wait_until(lambda: _dead_has(env, ids[3]), what="the long-key row dead")
    assert sorted(consumer.ids) == sorted(ids[:3] + ids[4:])
    reason = (await dead_reasons(env.pg_dsn))[ids[3]]
    assert reason.startswith("encode_error: routing_key: 300 bytes")
    assert relay.alive()


async def test_forged_outbox_header_on_an_unroutable_row__is_held_not_deleted_as_published(
    env: Env, consumer: Consumer, start_relay
) -> None:
    good = await _insert(env, _good(env, 3, "a"))
    # The producer writes the relay's own header with a routed row's id, on a row no queue takes.
    [forged] = await _insert(env, [(env.exchange, "no-queue-bound", {"forged": 1},
                                    {"headers": {"x-outbox-id": good[0]}})])
    relay = start_relay(retry_base_s=60)
    await consumer.wait_for(3)
    # Gone counts as settled too: a row deleted as published is the failure this test names.
    await wait_until(lambda: _attempted_or_gone(env, forged),
                     what="the unroutable row retried (or gone from the outbox)")
    row = await pg_fetchrow(
        env.pg_dsn, "SELECT attempts, last_error FROM queue_message WHERE id = $1", forged)
    assert row is not None, "the unroutable row was deleted as published: the message is lost"
    assert row["attempts"] == 1
    assert row["last_error"].startswith("unroutable:")
    assert sorted(consumer.ids) == sorted(good)
    assert relay.alive()


async def _empty(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0


async def _dead_has(env: Env, row_id: str) -> bool:
    return row_id in await dead_reasons(env.pg_dsn)


async def _attempted_or_gone(env: Env, row_id: str) -> bool:
    attempts = await pg_fetchval(
        env.pg_dsn, "SELECT attempts FROM queue_message WHERE id = $1", row_id)
    return attempts is None or attempts > 0


def _connections_opened(events: list[dict[str, Any]]) -> int:
    """Broker connections the relay opened: the first, plus one per restored outage."""
    restored = [e for e in events
                if e.get("event") == "connection_restored" and e.get("connection") == "broker"]
    return 1 + len(restored)


async def test_rows_the_broker_would_refuse_at_the_protocol_level__dead_without_a_reconnect(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """Each of these closed the channel or, for the oversize header frame, the whole
    connection, when sent: refused before sending, the line and the connection stay up."""
    refused = [
        (env.exchange, env.routing_key, {"cc": 1}, {"headers": {"CC": "queue-a"}}),
        (env.exchange, env.routing_key, {"big": 1}, {"headers": {"pad": "x" * 140_000}}),
        (env.exchange, env.routing_key, {"ttl": 1}, {"expiration": 10**13}),
        ("ünïcode-exchange", env.routing_key, {"x": 1}, None),
        (env.exchange, env.routing_key, {"n": 1}, {"headers": {"n": 2**64}}),
        (env.exchange, env.routing_key, {"u": 1}, {"userId": "mallory"}),
    ]
    ids = await _insert(env, [*_good(env, 3, "a"), *refused, *_good(env, 3, "b")])
    bad = ids[3:9]
    relay = start_relay()
    await consumer.wait_for(6)
    await wait_until(lambda: _all_dead(env, bad), what="the refused rows dead")
    assert sorted(consumer.ids) == sorted(ids[:3] + ids[9:])
    reasons = await dead_reasons(env.pg_dsn)
    codes = [reasons[i].split(":", 1)[0] for i in bad]
    assert codes == ["encode_error", "too_large", "invalid_option", "encode_error",
                     "encode_error", "forbidden"]
    assert _connections_opened(relay.log_events()) == 1


async def test_rows_read_by_the_brokers_own_rules__refused_ones_dead_floats_exact_no_duplicate(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """RabbitMQ parses expiration as ASCII digits (Arabic-Indic and full-width digits passed
    str.isdigit() and closed the shared channel, re-sending everything in flight on it), and
    a header float written as 32-bit lost its value (12345678.9 arrived as 12345679.0)."""
    refused = [
        (env.exchange, env.routing_key, {"arabic": 1}, {"expiration": "٦٠٠٠٠"}),
        (env.exchange, env.routing_key, {"fullwidth": 1}, {"expiration": "６００００"}),
    ]
    accepted = [
        (env.exchange, env.routing_key, {"signed": 1}, {"expiration": "+600000"}),
        (env.exchange, env.routing_key, {"float": 1}, {"headers": {"f": 12345678.9,
                                                                   "g": [1e-300, 0.1]}}),
    ]
    ids = await _insert(env, [*_good(env, 200, "a"), *refused, *accepted, *_good(env, 200, "b")])
    bad = ids[200:202]
    relay = start_relay()
    await consumer.wait_for(402)
    await wait_until(lambda: _all_dead(env, bad), what="the refused rows dead")
    assert sorted(set(consumer.ids)) == sorted(set(ids) - set(bad))
    assert consumer.duplicates() == 0
    reasons = await dead_reasons(env.pg_dsn)
    assert all(reasons[i].startswith("invalid_option: options.expiration") for i in bad)
    floated = next(m for m in consumer.messages if m.message_id == ids[203])
    assert floated.headers["f"] == 12345678.9
    assert floated.headers["g"] == [1e-300, 0.1]
    signed = next(m for m in consumer.messages if m.message_id == ids[202])
    assert signed.expiration is not None
    assert _connections_opened(relay.log_events()) == 1


async def _all_dead(env: Env, row_ids: list[str]) -> bool:
    return set(row_ids) <= set(await dead_reasons(env.pg_dsn))
