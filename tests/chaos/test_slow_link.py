"""A slow link to RabbitMQ: confirms that come after the batch's budget are not the rows'
fault. A row is never both delivered and parked, and every row arrives (real servers, a real
`relay run` behind a bandwidth-limited proxy)."""

from __future__ import annotations

import json
import time
from urllib.parse import urlsplit

import pytest

from tests.chaos.harness import via_proxy
from tests.helpers import Consumer, Env, count_rows, pg_fetch, wait_until
from tests.proxy import TcpProxy

pytestmark = pytest.mark.chaos

LINK_BYTES_PER_S = 2_000_000  # relay -> broker; the answers come back at full speed


async def test_slow_link__late_confirms_leave_rows_untouched_never_parked_all_delivered(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """A pass whose confirms timed out while others came counted an attempt for messages
    still on their way: on a slow link a row was delivered several times and then parked."""
    parts = urlsplit(env.amqp_url)
    link = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672,
                          up_bytes_per_s=LINK_BYTES_PER_S).start()
    body = json.dumps({"pad": "p" * 4000})
    ids = [r[0] for r in await pg_fetch(
        env.pg_dsn, "INSERT INTO queue_message (exchange, routing_key, content) "
        "SELECT $1, $2, $3::jsonb FROM generate_series(1, 2000) RETURNING id::text",
        env.exchange, env.routing_key, body)]
    try:
        # One attempt: a late confirm charged as an attempt would park the row at once.
        relay = start_relay(amqp_url=via_proxy(env.amqp_url, link.port), publish_timeout_s=2,
                            max_attempts=1)
        await consumer.wait_for(len(ids), timeout_s=180)
        await wait_until(lambda: _settled(env), timeout_s=60, what="an empty outbox")
        dead = await count_rows(env.pg_dsn, "queue_message_dead")
        assert dead == 0, f"{dead} rows parked for confirms that came late"
        assert set(consumer.ids()) == set(ids)
        print(f"\n[chaos] slow link: {len(ids)} rows delivered, "
              f"{consumer.duplicates()} duplicate receipts (late confirms re-published)")
        assert relay.alive()
    finally:
        await link.close()


async def _settled(env: Env) -> bool:
    return await count_rows(env.pg_dsn) == 0


async def test_slow_link__the_defaults_drain_at_the_link_speed_duplicating_only_missed_batches(
    env: Env, consumer: Consumer, start_relay
) -> None:
    """With the defaults, a link under about 1.6 MB/s per lane made every batch's write outlast
    the publish budget: each such batch was marked lost whole (confirmed messages too), the
    shared channel was closed under the other lanes, and the same rows were claimed and sent
    again for ever: nothing was ever deleted. Now what was confirmed is kept, a deadline
    closes no channel, and a lane that missed its deadline claims fewer bytes."""
    parts = urlsplit(env.amqp_url)
    link = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672,
                          up_bytes_per_s=1_000_000).start()
    body = json.dumps({"pad": "p" * 40_000})
    ids = [r[0] for r in await pg_fetch(
        env.pg_dsn, "INSERT INTO queue_message (exchange, routing_key, content) "
        "SELECT $1, $2, $3::jsonb FROM generate_series(1, 600) RETURNING id::text",
        env.exchange, env.routing_key, body)]
    try:
        relay = start_relay(amqp_url=via_proxy(env.amqp_url, link.port))
        started = time.monotonic()
        # 24 MB at 1 MB/s: 24 s at the link's speed; the bound leaves room for one batch
        # per lane sent again after each missed deadline, not for sending everything again.
        await wait_until(lambda: _settled(env), timeout_s=60,
                         what="the outbox drained over a 1 MB/s link")
        took = time.monotonic() - started
        await consumer.wait_for(len(ids), timeout_s=30)
        assert set(consumer.ids()) == set(ids)
        assert await count_rows(env.pg_dsn, "queue_message_dead") == 0
        missed = sum(e.get("count", 0) for e in relay.log_events()
                     if e.get("event") == "rows_untouched" and e.get("reason") == "deadline")
        events = relay.log_events()
        dropped = [e for e in events if e.get("event") == "connection_lost"]
        print(f"\n[chaos] 1 MB/s link: {len(ids)} rows drained in {took:.0f} s, "
              f"{consumer.duplicates()} duplicate receipts, {missed} rows of batches that "
              f"missed their deadline, {len(dropped)} broker connections dropped")
        assert consumer.duplicates() <= missed
        assert not dropped, "a slow link is not a silent broker: the connection was dropped"
        assert relay.alive()
    finally:
        await link.close()
