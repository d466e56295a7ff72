"""The ceilings the relay is measured against, each alone, in the same run.

- aio-pika pipelined: confirms pipelined (up to 1,000 in flight) on one confirm channel;
- bulk frames: BulkPublisher (relay/amqp/pipeline.py) alone, no database (3 x 500 in flight);
- PostgreSQL claim/delete: `DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)` on
  3 connections, rows returned as the relay would read them;
- classic: the per-row design this project replaces (one transaction and one new confirm
  channel per row), written for the suite as the baseline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aio_pika
import asyncpg

from bench.common import AMQP_URL, ROUTING_KEY, BenchEnv, insert_backlog, purge_queue
from relay.amqp.pipeline import BulkPublisher
from relay.interfaces import Message
from relay.options import Properties

BODY = (
    b'{"order_id": 123456, "customer": "customer-12", "sku": "SKU-012345", "qty": 3, '
    b'"amount_cents": 45678, "currency": "EUR", "note": "' + b"x" * 64 + b'", '
    b'"created": "2026-01-01T00:00:00Z"}'
)


async def aio_pika_limit(env: BenchEnv, messages: int, in_flight: int = 1000) -> dict[str, Any]:
    """Persistent publishes through aio-pika's exchange.publish, confirms pipelined."""
    conn = await aio_pika.connect(AMQP_URL)
    try:
        channel = await conn.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(env.exchange)
        gate = asyncio.Semaphore(in_flight)

        async def one() -> None:
            async with gate:
                msg = aio_pika.Message(
                    BODY,
                    message_id=str(uuid.uuid4()),
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await exchange.publish(msg, ROUTING_KEY, mandatory=True)

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(messages)))
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
    await purge_queue(env)
    return {"messages": messages, "seconds": round(seconds, 3), "msg_per_s": messages / seconds}


async def bulk_frame_limit(
    env: BenchEnv, messages: int, batch: int = 500, lanes: int = 3
) -> dict[str, Any]:
    """The relay's bulk publisher alone: `lanes` batches in flight, no database."""
    publisher = BulkPublisher(AMQP_URL, publish_timeout_s=60, reconnect_max_s=5)
    await publisher.connect()
    props = Properties()
    batches = [
        [
            Message(str(uuid.uuid4()), env.exchange, ROUTING_KEY, BODY, props, True)
            for _ in range(min(batch, messages - start))
        ]
        for start in range(0, messages, batch)
    ]
    queue: asyncio.Queue[list[Message]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)
    confirmed = 0

    async def lane() -> None:
        nonlocal confirmed
        while not queue.empty():
            result = await publisher.publish(queue.get_nowait())
            confirmed += len(result.confirmed)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(lanes)))
        seconds = time.perf_counter() - started
    finally:
        await publisher.close()
    await purge_queue(env)
    if confirmed != messages:
        raise RuntimeError(f"bulk limit: {confirmed} of {messages} confirmed")
    return {"messages": messages, "seconds": round(seconds, 3), "msg_per_s": messages / seconds}


CLAIM_DELETE = """
DELETE FROM queue_message WHERE id IN (
    SELECT id FROM queue_message WHERE available_at <= now()
    ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id::text, exchange, routing_key, content::text, options::text, attempts
"""


async def pg_claim_delete_limit(
    env: BenchEnv, rows: int, batch: int = 500, lanes: int = 3
) -> dict[str, Any]:
    """How fast PostgreSQL alone claims and deletes the backlog, `lanes` connections."""
    conn = await asyncpg.connect(env.dsn)
    try:
        await insert_backlog(conn, env, rows)
        await conn.execute("ANALYZE queue_message")
    finally:
        await conn.close()
    conns = [await asyncpg.connect(env.dsn) for _ in range(lanes)]

    async def lane(c: asyncpg.Connection) -> None:
        while await c.fetch(CLAIM_DELETE, batch):
            pass

    try:
        started = time.perf_counter()
        await asyncio.gather(*(lane(c) for c in conns))
        seconds = time.perf_counter() - started
        await conns[0].execute("VACUUM queue_message")
    finally:
        for c in conns:
            await c.close()
    return {"rows": rows, "seconds": round(seconds, 3), "msg_per_s": rows / seconds}


CLASSIC_CLAIM = """
SELECT id::text, exchange, routing_key, content::text, options
FROM queue_message ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED
"""


async def classic_relay(env: BenchEnv, rows: int, workers: int = 1) -> dict[str, Any]:
    """The classic per-row design: per row one transaction and one new confirm channel.

    Each worker loops: BEGIN; lock one row; open a confirm channel; publish; wait for the
    confirm; close the channel; DELETE; COMMIT. `workers` such loops run side by side (as
    that many processes would).
    """
    conn = await asyncpg.connect(env.dsn)
    try:
        await insert_backlog(conn, env, rows)
    finally:
        await conn.close()
    amqp = await aio_pika.connect(AMQP_URL)
    conns = [await asyncpg.connect(env.dsn) for _ in range(workers)]

    async def worker(c: asyncpg.Connection) -> None:
        while True:
            async with c.transaction():
                row = await c.fetchrow(CLASSIC_CLAIM)
                if row is None:
                    return
                channel = await amqp.channel(publisher_confirms=True)
                try:
                    exchange = await channel.get_exchange(row["exchange"], ensure=False)
                    msg = aio_pika.Message(
                        row["content"].encode(),
                        message_id=row["id"],
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    )
                    await exchange.publish(msg, row["routing_key"])
                finally:
                    await channel.close()
                await c.execute("DELETE FROM queue_message WHERE id = $1::uuid", row["id"])

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        seconds = time.perf_counter() - started
    finally:
        for c in conns:
            await c.close()
        await amqp.close()
    await purge_queue(env)
    return {"rows": rows, "workers": workers, "seconds": round(seconds, 3),
            "msg_per_s": rows / seconds}
