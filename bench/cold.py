"""Relays that went idle: a bulk committed after the relays sat idle on an emptied outbox that
VACUUM ANALYZE recorded as empty (what autovacuum does after a quiet spell), with live one-row
transactions beside it, and no ANALYZE of the bulk (autoanalyze has not come round yet): how
long its first messages took from its commit, the live rows' latency while it drained, and its
rate."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from bench.common import (
    BenchEnv,
    insert_backlog,
    load_before,
    relays,
    tail_ms,
    wait_drained,
    wait_queued,
)
from bench.latency import LIVE_KEY, LIVE_RATE, Producers

FIRST = 10_000  # the bulk's first messages, whose arrival the target bounds
WARM_ROWS = 20_000  # drained before the idle spell, so that the relays have planned on rows


async def cold_once(env: BenchEnv, rows: int, *, relays_n: int, idle_s: float,
                    live_s: float) -> dict[str, Any]:
    """`relays_n` relays drain a warm-up backlog, sit idle `idle_s` after a VACUUM ANALYZE of the
    emptied outbox, then a bulk of `rows` commits with live rows beside it for `live_s`."""
    conn = await asyncpg.connect(env.dsn)
    try:
        async with relays(env, relays_n, "cold", consume=env.queue + "-live") as received:
            warm = min(WARM_ROWS, rows)
            await insert_backlog(conn, env, warm)
            await wait_drained(conn, env, warm, 300)
            await env.purge()
            await conn.execute("VACUUM ANALYZE queue_message")
            await asyncio.sleep(idle_s)
            load = load_before()
            live = Producers(env, LIVE_RATE, live_s, connections=1, routing_key=LIVE_KEY)
            live_task = asyncio.create_task(live.run())
            committed = await insert_backlog(conn, env, rows, analyze=False)
            # the bulk's first messages in the queue (polled every 20 ms)
            first = await wait_queued(env, min(FIRST, rows), 300, interval_s=0.02)
            drained = await wait_drained(conn, env, rows, 900)
            await received.wait_for(await live_task)
            await env.purge()
    finally:
        await conn.close()
    during = [(received[k] - t) * 1000 for k, t in live.committed.items()
              if committed <= t <= drained]
    return {"bulk_rows": rows, "relays": relays_n, "idle_s": idle_s,
            "first_n": min(FIRST, rows), "first_s": round(first - committed, 3),
            "bulk_msg_per_s": round(rows / (drained - committed), 1),
            "live_rows_during_drain": len(during), **tail_ms(during, "live_"),
            "load_before": load}
