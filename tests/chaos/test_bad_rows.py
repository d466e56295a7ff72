"""Bad rows of every kind interleaved with 3,000 good rows: every good row is delivered exactly
once, every bad row is dead-lettered with a reason naming its fault, the relay stays up."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import pytest

from tests.chaos.harness import assert_drained, assert_exactly_delivered, relays, report
from tests.helpers import Env, dead_reasons, pg_session, wait_until
from tests.kit.consumer import Consumer

pytestmark = pytest.mark.chaos

MAX_BYTES = 4096
# kind -> (exchange or None for the test's, routing key, content, options, expected reason part)
BAD: dict[str, tuple[str | None, str, str | None, str | None, str]] = {
    "unknown option": ("", "rk", '{"b": 1}', '{"bogus": 1}', "options.bogus: unknown option"),
    "wrong type": ("", "rk", '{"b": 2}', '{"priority": "high"}', "options.priority:"),
    "options not an object": ("", "rk", '{"b": 3}', "[1, 2]", "options: must be a JSON object"),
    "oversize": ("", "rk", json.dumps({"pad": "x" * MAX_BYTES}), None, "exceeds the maximum"),
    "unknown exchange": ("relay-chaos-no-such-exchange", "rk", '{"b": 5}', None,
                         "exchange 'relay-chaos-no-such-exchange' not found"),
    "unroutable": ("", "nowhere", '{"b": 6}', None, "unroutable"),
    "null content": ("", "rk", None, None, "content: NULL"),
    "null exchange": ("<null>", "rk", '{"b": 8}', None, "exchange: NULL"),
    "foreign userId": ("", "rk", '{"b": 9}', '{"userId": "mallory"}', "options.userId"),
}
PER_KIND = 5


async def test_bad_rows__dead_lettered_with_reasons_while_good_rows_flow_exactly_once(
    env: Env, tmp_path: Path
) -> None:
    rows: list[tuple[str, str | None, str, str | None, str | None]] = []
    good_ids: list[str] = []
    for n in range(3000):
        rid = str(uuid.uuid4())
        good_ids.append(rid)
        rows.append((rid, env.exchange, env.routing_key, json.dumps({"n": n}), None))
    expected: dict[str, tuple[str, str]] = {}
    rng = random.Random(4)
    for kind, (exchange, key, content, options, reason) in BAD.items():
        for _ in range(PER_KIND):
            rid = str(uuid.uuid4())
            expected[rid] = (kind, reason)
            x = None if exchange == "<null>" else (exchange or env.exchange)
            rows.insert(rng.randrange(len(rows)), (rid, x, key, content, options))

    async with pg_session(env.pg_dsn) as conn:
        # A table of the classic shape allows NULLs; such rows must be dead-lettered, not crash.
        await conn.execute("ALTER TABLE queue_message ALTER COLUMN content DROP NOT NULL, "
                           "ALTER COLUMN exchange DROP NOT NULL")
        # Hand-written: rows no application INSERT would make (NULL content or exchange).
        await conn.executemany(
            "INSERT INTO queue_message (id, exchange, routing_key, content, options) "
            "VALUES ($1, $2, $3, $4::jsonb, $5::jsonb)", rows)

    consumer = await Consumer(env.amqp_url, env.queue, robust=True, manual_ack=True).start()
    try:
        with relays(env, tmp_path, max_attempts=2, retry_base_s=0.2,
                    max_message_bytes=MAX_BYTES, batch_size=200) as group:
            relay = group.start()
            await consumer.wait_all(good_ids, timeout_s=60, dsn=env.pg_dsn)
            await assert_drained(env.pg_dsn, timeout_s=30)
            outcome = report("bad rows interleaved", good_ids, consumer)
            assert not set(consumer.ids) & set(expected), "no bad row was delivered"
            # No fault here: every good row exactly once.
            assert_exactly_delivered(good_ids, consumer, outcome, 0)
            assert outcome.duplicates == 0

            dead = await dead_reasons(env.pg_dsn)
            assert set(dead) == set(expected)
            wrong = {kind: dead[rid] for rid, (kind, part) in expected.items()
                     if part not in dead[rid]}
            assert not wrong, f"reasons that do not name the fault: {wrong}"
            for kind in BAD:
                sample = next(dead[r] for r, (k, _) in expected.items() if k == kind)
                print(f"[chaos]   {kind:<22} -> {sample[:110]}")
            await wait_until(relay.alive, what="relay alive")
            assert relay.terminate() == 0
    finally:
        await consumer.stop()
