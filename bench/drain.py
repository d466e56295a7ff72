"""Drains: `relay run` processes, started first and asleep, empty a backlog committed at once
(from its commit to the last delete), with the CPU every process group used meanwhile; and the
bulk-frame publish limit they are measured against (docs/speed.md)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg

from bench.common import (
    AMQP_URL,
    BODY,
    ROUTING_KEY,
    BenchEnv,
    cpu_s,
    cpu_split,
    insert_backlog,
    load_before,
    relays,
    wait_drained,
)
from relay.amqp.pipeline import BulkPublisher
from relay.interfaces import Message
from relay.options import Properties

OWN_BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")


async def drain_once(env: BenchEnv, rows: int, *, processes: int = 1, publisher: str = "bulk",
                     pinned: bool = False, extra_env: dict[str, str] | None = None,
                     options_sql: str = "NULL") -> dict[str, Any]:
    """One drain of `rows` rows: msg/s, cores and CPU-seconds per 1,000 messages by group.
    pinned: a REPEATABLE READ snapshot from before the insert is held until the drain ends."""
    conn = await asyncpg.connect(env.dsn)
    holder = await asyncpg.connect(env.dsn)
    try:
        if pinned:
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM queue_message")
        async with relays(env, processes, "drain", extra_env=extra_env,
                          publisher=publisher) as started:
            load = load_before()
            own0 = {r["pid"]: cpu_s(r["pid"]) for r in await conn.fetch(OWN_BACKENDS)}
            with cpu_split(started.pids) as cpu:
                committed = await insert_backlog(conn, env, rows, options_sql)
                seconds = await wait_drained(conn, env, rows, 900.0) - committed
            own = set(own0) | {r["pid"] for r in await conn.fetch(OWN_BACKENDS)}
            own_cpu = sum(cpu_s(p) - own0.get(p, 0.0) for p in own)
        await holder.close()
        await conn.execute("VACUUM queue_message")
    finally:
        await holder.close()
        await conn.close()
    await env.purge()
    # The insert is inside the CPU window: per-message CPU uses the window's length.
    window_s = cpu.pop("window_s")
    per_1k = {k: round(v * window_s / rows * 1000, 4) for k, v in cpu.items()
              if k not in ("machine_busy", "other")}
    per_1k["postgres_own_sessions"] = round(own_cpu / rows * 1000, 4)
    return {"rows": rows, "processes": processes, "publisher": publisher, "pinned": pinned,
            "seconds": round(seconds, 3), "msg_per_s": round(rows / seconds, 1),
            "cpu_cores": cpu, "cpu_s_per_1k_msgs": per_1k, "load_before": load}


async def bulk_frame_limit(env: BenchEnv, messages: int, batch: int = 500,
                           lanes: int = 3) -> dict[str, Any]:
    """The relay's bulk publisher alone, no database: `lanes` batches of `batch` in flight."""
    publisher = BulkPublisher(AMQP_URL, publish_timeout_s=60, reconnect_max_s=5)
    await publisher.connect()
    body = BODY.encode()
    batches = [[Message(str(uuid.uuid4()), env.exchange, ROUTING_KEY, body, Properties(), True)
                for _ in range(min(batch, messages - start))]
               for start in range(0, messages, batch)]
    confirmed: list[int] = []

    async def lane() -> None:
        while batches:
            result = await publisher.publish(batches.pop())
            confirmed.append(len(result.confirmed))

    try:
        started = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(lanes)))
        seconds = time.perf_counter() - started
    finally:
        await publisher.close()
    await env.purge()
    if sum(confirmed) != messages:
        raise RuntimeError(f"bulk limit: {sum(confirmed)} of {messages} confirmed")
    return {"messages": messages, "seconds": round(seconds, 3), "msg_per_s": messages / seconds}
