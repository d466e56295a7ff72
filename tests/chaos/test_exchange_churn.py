"""An exchange deleted and declared again every two seconds while three lanes publish to it
(about 1,000 routable rows a second arrive meanwhile), among rows the broker returns (no queue
bound to their key, retried all along): no returned row is deleted as
published, every routable row arrives, and the broker never closes the relay's connection for
frames on a closed channel (a 504 CHANNEL_ERROR connection exception in its log)."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import pytest

from tests.chaos.harness import relays
from tests.helpers import Env, pg_fetchval, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import fresh_ids, insert_with_ids

pytestmark = pytest.mark.chaos

CHURN_S = 12.0
RATE_ROWS, EVERY_S = 50, 0.05  # about 1,000 routable rows a second while the churn runs


async def _produce(env: Env, ids: list[str], stop: asyncio.Event) -> None:
    """Routable rows in small transactions until `stop`."""
    while not stop.is_set():
        chunk = fresh_ids(RATE_ROWS)
        await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, chunk)
        ids.extend(chunk)
        await asyncio.sleep(EVERY_S)


async def _churn(env: Env, stop: asyncio.Event) -> int:
    """Delete the test's exchange, wait half a second, declare and bind it again, wait one
    and a half: until `stop`. Returns how many times it was deleted."""
    conn = await aio_pika.connect(env.amqp_url)
    deleted = 0
    try:
        channel = await conn.channel()
        queue = await channel.get_queue(env.queue)
        while not stop.is_set():
            await channel.exchange_delete(env.exchange)
            deleted += 1
            await asyncio.sleep(0.5)
            x = await channel.declare_exchange(env.exchange, aio_pika.ExchangeType.DIRECT,
                                               durable=True)
            await queue.bind(x, env.routing_key)
            await asyncio.sleep(1.5)
    finally:
        await conn.close()
    return deleted


def _broker_log_since(started: datetime) -> list[str]:
    """The shared broker's log lines written since `started` (its own timestamps, UTC)."""
    done = subprocess.run(["rabbitmq-diagnostics", "-q", "log_location"], capture_output=True,
                          text=True, timeout=60, check=True)
    path = Path(done.stdout.split()[-1])
    stamp = started.strftime("%Y-%m-%d %H:%M:%S")
    return [line for line in path.read_text(errors="replace").splitlines()
            if line[:19] >= stamp]


async def test_exchange_churn__no_returned_row_published_no_frames_on_a_closed_channel(
    env: Env, tmp_path: Path
) -> None:
    started = datetime.now(UTC)
    good, returned = fresh_ids(3000), fresh_ids(60)
    await insert_with_ids(env.pg_dsn, env.exchange, "nowhere", returned[:30])
    await insert_with_ids(env.pg_dsn, env.exchange, env.routing_key, good)
    await insert_with_ids(env.pg_dsn, env.exchange, "nowhere", returned[30:])
    consumer = await Consumer(env.amqp_url, env.queue, robust=True).start()
    stop = asyncio.Event()
    churn = asyncio.ensure_future(_churn(env, stop))
    producer = asyncio.ensure_future(_produce(env, good, stop))
    try:
        with relays(env, tmp_path, concurrency=3, batch_size=100, max_attempts=1000,
                    retry_base_s=0.2, retry_max_s=1) as group:
            relay = group.start()
            await asyncio.sleep(CHURN_S)
            stop.set()
            deleted = await churn
            await producer
            await wait_until(lambda: set(good) <= set(consumer.ids), timeout_s=120,
                             interval_s=0.5, what="every routable row after the churn")
            assert relay.alive()
    finally:
        stop.set()
        await asyncio.gather(churn, producer, return_exceptions=True)
        await consumer.stop()
    kept = await pg_fetchval(
        env.pg_dsn, "SELECT (SELECT count(*) FROM queue_message WHERE id = ANY($1::uuid[])) "
        "+ (SELECT count(*) FROM queue_message_dead WHERE id = ANY($1::uuid[]))", returned)
    # A 404 closes a channel (expected: the exchange is gone); a frame on a channel already
    # closed is a connection exception (504 CHANNEL_ERROR) that closes the whole connection.
    errors = [line for line in await asyncio.to_thread(_broker_log_since, started)
              if "connection exception" in line]
    print(f"\n[chaos] exchange deleted {deleted} times under 3 lanes: {len(set(consumer.ids))} "
          f"routable rows delivered, {len(consumer.ids) - len(set(consumer.ids))} duplicates; "
          f"{kept} of {len(returned)} returned rows kept; {len(errors)} connection exceptions "
          "in the broker log")
    assert kept == len(returned), "a returned row was deleted as published"
    assert not set(returned) & set(consumer.ids)
    assert not errors, errors[:3]
