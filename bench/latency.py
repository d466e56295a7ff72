"""End-to-end latency at a fixed rate: producer commit -> consumer receipt, through `relay run`.

The producer commits a small INSERT every 10 ms (rate x 10 ms rows each, the classic INSERT;
the statement trigger's NOTIFY wakes the relay) and notes the time its commit returned; a
consumer in the same process notes when each message_id arrives. Both use one monotonic clock.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import AMQP_URL, BODY_SQL, ROUTING_KEY, BenchEnv, Relay, wait_empty

TICK_S = 0.01


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of an unsorted list."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


async def latency_once(
    env: BenchEnv, rate_per_s: int, duration_s: float, *, log_dir: Path | None = None
) -> dict[str, Any]:
    """Run the producer at `rate_per_s` for `duration_s`; p50/p95/p99 in milliseconds."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-latency-"))
    relay = Relay(env.relay_env(), log_dir / "relay.log")
    received: dict[str, float] = {}

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        received.setdefault(str(message.message_id), time.monotonic())

    amqp = await aio_pika.connect(AMQP_URL)
    producer = await asyncpg.connect(env.dsn)
    committed: dict[str, float] = {}
    try:
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=2000)
        queue = await channel.get_queue(env.queue)
        await queue.consume(on_message, no_ack=True)
        await relay.wait_started()
        per_tick = max(1, round(rate_per_s * TICK_S))
        sql = (
            f"INSERT INTO queue_message (exchange, routing_key, content) "
            f"SELECT $1, $2, {BODY_SQL} FROM generate_series(1, $3) AS g RETURNING id::text"
        )
        ticks = int(duration_s / TICK_S)
        start = time.monotonic()
        for i in range(ticks):
            ids = await producer.fetch(sql, env.exchange, ROUTING_KEY, per_tick)
            now = time.monotonic()
            for r in ids:
                committed[r[0]] = now
            delay = start + (i + 1) * TICK_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        achieved = len(committed) / (time.monotonic() - start)
        deadline = time.monotonic() + 60
        while len(received.keys() & committed.keys()) < len(committed):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(committed) - len(received)} messages never arrived")
            await asyncio.sleep(0.05)
        await wait_empty(producer, 30)
    finally:
        relay.stop()
        await producer.close()
        await amqp.close()
    lat_ms = [(received[k] - t) * 1000 for k, t in committed.items()]
    return {
        "rate_per_s": rate_per_s,
        "achieved_per_s": round(achieved, 1),
        "messages": len(lat_ms),
        "p50_ms": round(percentile(lat_ms, 50), 2),
        "p95_ms": round(percentile(lat_ms, 95), 2),
        "p99_ms": round(percentile(lat_ms, 99), 2),
        "max_ms": round(max(lat_ms), 2),
    }
