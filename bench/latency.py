"""Commit -> consumer latency, at a fixed commit rate and beside a bulk job (fairness): the
producers note when each commit returned, this process when each message arrived, on one
clock (CLOCK_MONOTONIC)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import asyncpg

from bench import common
from bench.common import (
    BODY,
    ROUTING_KEY,
    BenchEnv,
    insert_backlog,
    load_before,
    relays,
    sql,
    tail_ms,
    wait_drained,
    wait_quiet,
)

WARMUP_S = 1.0  # left out of the percentiles: connections and prepared statements start
LIVE_KEY, LIVE_RATE = "live", 200  # the live rows beside a bulk job: their key, commits/s


async def latency_once(env: BenchEnv, rate: int, seconds: float, *,
                       connections: int) -> dict[str, Any]:
    """Producers at `rate` commits/s for `seconds` through one relay; the tail in ms. A
    CHECKPOINT first, so an earlier scenario's writes are not flushed in the middle of it."""
    await sql(env.dsn, "CHECKPOINT")
    load = load_before()
    async with relays(env, 1, "latency", consume=env.queue) as received:
        producer = Producers(env, rate, seconds, connections=connections)
        committed = await producer.run()
        await received.wait_for(committed)
    start = min(committed.values())
    lat_ms = [(received[k] - t) * 1000 for k, t in committed.items() if t - start >= WARMUP_S]
    return {"rate_per_s": rate, "connections": connections,
            "achieved_per_s": producer.achieved, "messages": len(lat_ms), **tail_ms(lat_ms),
            "load_before": load}


async def fairness_once(env: BenchEnv, rows: int, *, relays_n: int,
                        quiet_below: float | None) -> dict[str, Any]:
    """A bulk of `rows` in one transaction drains alone, then again while one-row transactions
    at LIVE_RATE go to `<queue>-live`, consumed here, from its commit on: their latency while
    the bulk drained, and the bulk's rate beside them over alone."""
    conn = await asyncpg.connect(env.dsn)

    async def bulk(beside: Producers | None = None) -> tuple[float, float]:
        await sql(env.dsn, "CHECKPOINT")
        committed = await insert_backlog(conn, env, rows)
        live = asyncio.create_task(beside.run()) if beside else None
        drained = await wait_drained(conn, env, rows, 600)
        await env.purge()
        if live:
            await received.wait_for(await live)
        return committed, drained

    try:
        async with relays(env, relays_n, "fairness", consume=env.queue + "-live") as received:
            load_alone = load_before()
            start, end = await bulk()
            alone_s = end - start
            live = Producers(env, LIVE_RATE, alone_s * 1.5 + 2, connections=1,
                             routing_key=LIVE_KEY)
            await wait_quiet(quiet_below)  # the drain alone just loaded the machine
            load_beside = load_before()
            start, end = await bulk(live)
    finally:
        await conn.close()
    during = [(received[k] - t) * 1000 for k, t in live.committed.items() if t <= end]
    return {"bulk_rows": rows, "relays": relays_n, "live_rate_per_s": LIVE_RATE,
            "alone_msg_per_s": round(rows / alone_s, 1),
            "beside_live_msg_per_s": round(rows / (end - start), 1),
            "drain_ratio": round(alone_s / (end - start), 3),
            "live_rows_during_drain": len(during), **tail_ms(during, "live_"),
            "load_before_alone": load_alone, "load_before_beside": load_beside}


INSERT = ("INSERT INTO queue_message (exchange, routing_key, content) VALUES ($1, $2, $3::jsonb) "
          "RETURNING id::text")


class Producers:
    """This module's main in a process of its own: `rate` commits a second for `seconds` on
    `connections`, open-loop Poisson arrivals; each row's id and the time its commit returned."""

    def __init__(self, env: BenchEnv, rate: int, seconds: float, *, connections: int,
                 routing_key: str = ROUTING_KEY) -> None:
        self.spec = {"dsn": env.dsn, "exchange": env.exchange, "routing_key": routing_key,
                     "rate": rate, "seconds": seconds, "connections": connections}
        self.achieved, self.committed = 0.0, dict[str, float]()

    async def run(self) -> dict[str, float]:
        """Produce until done; each row's commit time, by id."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.latency", json.dumps(self.spec),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"producer failed: {stderr.decode()[-2000:]}")
        report = json.loads(stdout)
        self.achieved, self.committed = report["achieved_per_s"], report["committed"]
        return self.committed


async def produce(spec: dict[str, Any]) -> dict[str, Any]:
    """The producers' process: commit on every connection until `seconds` are over."""
    conns = [await asyncpg.connect(spec["dsn"]) for _ in range(spec["connections"])]
    committed: dict[str, float] = {}
    start = time.monotonic() + 0.05
    end, lam = start + spec["seconds"], spec["rate"] / spec["connections"]

    async def one(conn: asyncpg.Connection, rnd: random.Random) -> None:
        due = start + rnd.expovariate(lam)
        while due < end:
            await asyncio.sleep(max(due - time.monotonic(), 0))
            row_id = await conn.fetchval(INSERT, spec["exchange"], spec["routing_key"], BODY)
            committed[row_id] = time.monotonic()
            due += rnd.expovariate(lam)

    try:
        await asyncio.gather(*(one(c, random.Random(i)) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    elapsed = max(max(committed.values(), default=end) - start, spec["seconds"])
    return {"achieved_per_s": round(len(committed) / elapsed, 1), "committed": committed}


if __name__ == "__main__":
    print(json.dumps(common.run(lambda: produce(json.loads(sys.argv[1])))))
