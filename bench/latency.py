"""Commit -> consumer latency, alone at a fixed commit rate and beside a bulk job (fairness).

Producers run in a process of their own (this module's main: N connections, one 1-row
transaction per commit, open-loop Poisson arrivals) and note when each commit returned; this
process consumes and notes when each message arrived, both on CLOCK_MONOTONIC. Right before
each run, the machine's own floor: a commit on the run's server, a persistent publish's
confirm, how late a 1 ms timer wakes (docs/speed.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench import common
from bench.common import (
    AMQP_URL,
    ROUTING_KEY,
    BenchEnv,
    Receipts,
    Relay,
    insert_backlog,
    load_before,
    percentile,
    sql,
    tail_ms,
    wait_drained,
)

WARMUP_S = 1.0  # left out of the percentiles: connections and prepared statements start
LIVE_KEY, LIVE_RATE = "live", 200  # the live rows beside a bulk job: their key, commits/s


async def latency_once(env: BenchEnv, rate: int, seconds: float, *, connections: int = 4,
                       log_dir: Path) -> dict[str, Any]:
    """Producers at `rate` commits/s for `seconds` through one relay; the tail in ms. A
    CHECKPOINT first, so an earlier scenario's writes are not flushed in the middle of it."""
    await sql(env.dsn, "CHECKPOINT")
    load, floor = load_before(), await measure_floor(env.dsn)
    relay = Relay(env.relay_env(), log_dir / "relay.log")
    received = Receipts()
    producer = Producers(env, rate, seconds, log_dir / "ids.txt", connections=connections)
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        await received.consume(amqp, env.queue)
        await relay.wait_started()
        await producer.start()
        committed = await producer.committed()
        await received.wait_for(committed)
    finally:
        relay.stop()
        await amqp.close()
    start = min(committed.values())
    lat_ms = [(received[k] - t) * 1000 for k, t in committed.items() if t - start >= WARMUP_S]
    return {"rate_per_s": rate, "connections": connections,
            "achieved_per_s": producer.achieved, "messages": len(lat_ms), **tail_ms(lat_ms),
            "load_before": load, "floor": floor}


async def bind_live_queue(env: BenchEnv) -> str:
    """The queue of the live rows' routing key, bound to the scenario's exchange."""
    async with common.channel() as ch:
        queue = await ch.declare_queue(env.queue + "-live", durable=True)
        await queue.bind(env.exchange, LIVE_KEY)
    return env.queue + "-live"


async def fairness_once(env: BenchEnv, live_queue: str, rows: int, *, relays: int,
                        log_dir: Path) -> dict[str, Any]:
    """A bulk of `rows` in one transaction drains alone, then again while an application
    commits one row per transaction at LIVE_RATE from its commit on (consumed here): the live
    rows' latency while the bulk drained, and the bulk's rate beside them over alone."""
    procs = [Relay(env.relay_env(), log_dir / f"relay-{i}.log") for i in range(relays)]
    received = Receipts()
    amqp = await aio_pika.connect(AMQP_URL)
    conn = await asyncpg.connect(env.dsn)

    async def bulk(then: Callable[[], Awaitable[None]] | None = None) -> tuple[float, float]:
        await sql(env.dsn, "CHECKPOINT")
        committed = await insert_backlog(conn, env, rows)
        if then is not None:
            await then()
        drained = await wait_drained(conn, env, rows, 600)
        await env.purge()
        return committed, drained

    try:
        for proc in procs:
            await proc.wait_started()
        await received.consume(amqp, live_queue)
        load_alone = load_before()
        start, end = await bulk()
        alone_s = end - start
        live = Producers(env, LIVE_RATE, alone_s * 1.5 + 2, log_dir / "live-ids.txt",
                         connections=1, routing_key=LIVE_KEY)
        load_beside = load_before()
        start, end = await bulk(live.start)
        committed = await live.committed()
        await received.wait_for(committed)
    finally:
        for proc in procs:
            proc.stop()
        await amqp.close()
        await conn.close()
    during = [(received[k] - t) * 1000 for k, t in committed.items() if t <= end]
    return {"bulk_rows": rows, "relays": relays, "live_rate_per_s": LIVE_RATE,
            "alone_msg_per_s": round(rows / alone_s, 1),
            "beside_live_msg_per_s": round(rows / (end - start), 1),
            "drain_ratio": round(alone_s / (end - start), 3),
            "live_rows_during_drain": len(during), **tail_ms(during, "live_"),
            "load_before_alone": load_alone, "load_before_beside": load_beside}


async def _timed(samples: int, once: Callable[[int], Awaitable[Any]]) -> dict[str, float]:
    took = []
    for i in range(samples):
        started = time.perf_counter()
        await once(i)
        took.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(percentile(took, 50), 3), "p99_ms": round(percentile(took, 99), 3)}


async def measure_floor(dsn: str, samples: int = 200) -> dict[str, Any]:
    """The machine's floor now, p50 and p99 (ms) of three probes one after another."""
    out = {"timer_late": await _timed(samples, lambda _: asyncio.sleep(0.001))}
    out["timer_late"] = {k: round(v - 1, 3) for k, v in out["timer_late"].items()}
    conn = await asyncpg.connect(dsn)
    try:
        out["pg_commit"] = await _timed(samples, lambda _: conn.fetchval("SELECT txid_current()"))
    finally:
        await conn.close()
    name = f"bench-floor-{uuid.uuid4().hex[:8]}"
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel(publisher_confirms=True)
        queue = await ch.declare_queue(name, durable=True)
        out["amqp_confirm"] = await _timed(samples, lambda i: ch.default_exchange.publish(
            aio_pika.Message(b'{"floor": %d}' % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=name))
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await amqp.close()
    return out


INSERT = ("INSERT INTO queue_message (exchange, routing_key, content) VALUES ($1, $2, $3::jsonb) "
          "RETURNING id::text")
BODY = ('{"order_id": 123456, "customer": "customer-12", "sku": "SKU-012345", "qty": 3, '
        '"amount_cents": 45678, "currency": "EUR", "note": "' + "x" * 64 + '", '
        '"created": "2026-01-01T00:00:00Z"}')


class Producers:
    """This module's main in a process of its own: `rate` commits a second for `seconds` on
    `connections`; each row's id and commit time go to `out`."""

    def __init__(self, env: BenchEnv, rate: int, seconds: float, out: Path, *,
                 connections: int, routing_key: str = ROUTING_KEY) -> None:
        self.args = ["--dsn", env.dsn, "--exchange", env.exchange, "--rate", str(rate),
                     "--connections", str(connections), "--seconds", str(seconds),
                     "--routing-key", routing_key, "--out", str(out)]
        self.out, self.achieved = out, 0.0
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start producing."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.latency", *self.args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def committed(self) -> dict[str, float]:
        """Wait for the producers to end; each row's commit time, by id."""
        assert self.proc is not None
        stdout, stderr = await self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"producer failed: {stderr.decode()[-2000:]}")
        self.achieved = json.loads(stdout.decode().strip().splitlines()[-1])["achieved_per_s"]
        pairs = (line.split() for line in self.out.read_text().splitlines())
        return {row_id: float(t) for row_id, t in pairs}


async def produce(args: argparse.Namespace) -> tuple[list[tuple[str, float]], float]:
    """Commit on each connection on a Poisson schedule (a commit behind is sent at once)."""
    conns = [await asyncpg.connect(args.dsn) for _ in range(args.connections)]
    out: list[tuple[str, float]] = []
    start = time.monotonic() + 0.05
    end = start + args.seconds

    async def one(conn: asyncpg.Connection, rnd: random.Random) -> None:
        due = start + rnd.expovariate(args.rate / args.connections)
        while due < end:
            await asyncio.sleep(max(due - time.monotonic(), 0))
            row_id = await conn.fetchval(INSERT, args.exchange, args.routing_key, BODY)
            out.append((row_id, time.monotonic()))
            due += rnd.expovariate(args.rate / args.connections)

    try:
        await asyncio.gather(*(one(c, random.Random(i)) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    return out, max(max((t for _, t in out), default=end) - start, args.seconds)


def main() -> int:
    """The producer process."""
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=Producers.__doc__)
    for flag in ("--dsn", "--exchange", "--out", "--routing-key"):
        parser.add_argument(flag, required=True)
    for flag in ("--rate", "--seconds"):
        parser.add_argument(flag, type=float, required=True)
    parser.add_argument("--connections", type=int, required=True)
    args = parser.parse_args()
    rows, elapsed = common.run(lambda: produce(args))
    Path(args.out).write_text("".join(f"{i} {t!r}\n" for i, t in rows))
    print(json.dumps({"commits": len(rows), "achieved_per_s": round(len(rows) / elapsed, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
