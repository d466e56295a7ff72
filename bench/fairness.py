"""Live rows beside a bulk job: one-row transactions committed while a bulk transaction drains
(`python -m bench --scenario fairness`).

One run, with `relay run` at its defaults already running and idle:
1. alone: a bulk job commits its rows in one INSERT ... SELECT; the time until every
   message is in the bulk queue and the outbox is empty gives the bulk's rate alone;
2. beside live rows: the same bulk, and from its commit on an application commits one row per
   transaction at LIVE_RATE (bench/latency.py's producer process, Poisson arrivals) to another
   routing key, bound to a queue this process consumes. Each live row's latency is commit ->
   consumer (CLOCK_MONOTONIC in both processes); only rows committed before the bulk drained
   count. The bulk's rate beside them over its rate alone is the cost of fairness.

The bulk queue is not consumed during the run (as in bench/drain.py); the live queue is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import (
    AMQP_URL,
    BenchEnv,
    Receipts,
    Relay,
    checkpoint,
    insert_backlog,
    load_before,
    purge_queue,
    tail_ms,
    wait_drained,
)
from bench.latency import ProducerProcess

LIVE_KEY = "live"
LIVE_RATE = 200  # one-row transactions per second, the targets' rate


async def bind_live_queue(env: BenchEnv) -> str:
    """The queue of the live rows' routing key, bound to the scenario's exchange."""
    queue = env.queue + "-live"
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        q = await ch.declare_queue(queue, durable=True)
        await q.bind(env.exchange, LIVE_KEY)
    finally:
        await amqp.close()
    return queue


async def _bulk(env: BenchEnv, rows: int, live: ProducerProcess | None = None,
                ) -> tuple[float, float]:
    """Commit the bulk (and start `live`'s producer at once); (commit time, time drained)."""
    conn = await asyncpg.connect(env.dsn)
    try:
        committed = await insert_backlog(conn, env, rows)
        if live is not None:
            await live.start()
        drained = await wait_drained(conn, env, rows, timeout_s=600)
    finally:
        await conn.close()
    return committed, drained


async def run_once(env: BenchEnv, live_queue: str, rows: int, *, live_rate: int,
                   relays: int, log_dir: Path, settings: dict[str, str]) -> dict[str, Any]:
    """The bulk alone, then beside live rows, with the same running relays."""
    procs = [Relay(env.relay_env(**settings), log_dir / f"relay-{i}.log")
             for i in range(relays)]
    received = Receipts()
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        for proc in procs:
            await proc.wait_started()
        await received.consume(amqp, live_queue, prefetch=1000)

        await checkpoint(env)
        load_alone = load_before()
        start, end = await _bulk(env, rows)
        alone_s = end - start
        await purge_queue(env)

        await checkpoint(env)
        load_mixed = load_before()
        live = ProducerProcess(env, live_rate, alone_s * 1.5 + 2, log_dir / "live-ids.txt",
                               routing_key=LIVE_KEY)
        start, end = await _bulk(env, rows, live)
        mixed_s = end - start
        committed = await live.committed()
        await received.wait_for(committed)
    finally:
        for proc in procs:
            proc.stop()
        await amqp.close()
    during = [(received[k] - t) * 1000 for k, t in committed.items() if t <= end]
    # Each live row's commit time (from the bulk's commit) and latency, for reading the tail.
    (log_dir / "live-latencies.txt").write_text("".join(
        f"{t - start:.6f} {(received[k] - t) * 1000:.3f}\n" for k, t in committed.items()))
    received.clear()
    await purge_queue(env)
    return {
        "bulk_rows": rows,
        "relays": relays, "live_rate_per_s": live_rate,
        "alone_msg_per_s": round(rows / alone_s, 1),
        "beside_live_msg_per_s": round(rows / mixed_s, 1),
        "drain_ratio": round(alone_s / mixed_s, 3),
        "live_rows_during_drain": len(during),
        **tail_ms(during, "live_"),
        "load_before_alone": load_alone, "load_before_beside": load_mixed,
    }
