"""Live rows beside a bulk job: one-row transactions committed while a bulk transaction drains
(`python -m bench --scenario fairness`).

One run, with `relay run` at its defaults already running and idle:
1. alone: a bulk job commits its rows in one INSERT ... SELECT; the time until every
   message is in the bulk queue and the outbox is empty gives the bulk's rate alone;
2. beside live rows: the same bulk, and from its commit on an application commits one row per
   transaction at LIVE_RATE (bench/producer.py, Poisson arrivals, its own process) to another
   routing key, bound to a queue this process consumes. Each live row's latency is commit ->
   consumer (CLOCK_MONOTONIC in both processes); only rows committed before the bulk drained
   count. The bulk's rate beside them over its rate alone is the cost of fairness.

The bulk queue is not consumed during the run (as in bench/drain.py); the live queue is.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import (
    AMQP_URL,
    BenchEnv,
    Relay,
    checkpoint,
    insert_backlog,
    load_before,
    percentile,
    purge_queue,
    wait_drained,
)

LIVE_KEY = "live"
LIVE_RATE = 200  # one-row transactions per second, the targets' rate


async def bind_live_queue(env: BenchEnv) -> str:
    queue = env.queue + "-live"
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        q = await ch.declare_queue(queue, durable=True)
        await q.bind(env.exchange, LIVE_KEY)
    finally:
        await amqp.close()
    return queue


async def _bulk(env: BenchEnv, rows: int, live: Live | None = None) -> tuple[float, float]:
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


@dataclass
class Live:
    """The application's producer: one row per transaction at `rate`, in its own process
    (bench/producer.py), to the live routing key; each row's id and commit time go to `out`."""

    env: BenchEnv
    rate: int
    seconds: float
    out: Path
    proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start producing."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.producer", "--dsn", self.env.dsn,
            "--exchange", self.env.exchange, "--rate", str(self.rate), "--connections", "1",
            "--seconds", str(self.seconds), "--routing-key", LIVE_KEY, "--out", str(self.out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def committed(self) -> dict[str, float]:
        """Wait for the producer to end; each row's commit time (CLOCK_MONOTONIC), by id."""
        assert self.proc is not None
        _, stderr = await self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"live producer failed: {stderr.decode()[-2000:]}")
        pairs = (line.split() for line in self.out.read_text().splitlines())
        return {row_id: float(t) for row_id, t in pairs}


async def run_once(env: BenchEnv, live_queue: str, rows: int, *, live_rate: int,
                   relays: int, log_dir: Path, settings: dict[str, str]) -> dict[str, Any]:
    """The bulk alone, then beside live rows, with the same running relays."""
    procs = [Relay(env.relay_env(**settings), log_dir / f"relay-{i}.log")
             for i in range(relays)]
    received: dict[str, float] = {}

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        received.setdefault(str(message.message_id), time.monotonic())

    amqp = await aio_pika.connect(AMQP_URL)
    try:
        for proc in procs:
            await proc.wait_started()
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=1000)
        await (await channel.get_queue(live_queue)).consume(on_message, no_ack=True)

        await checkpoint(env)
        load_alone = load_before()
        start, end = await _bulk(env, rows)
        alone_s = end - start
        await purge_queue(env)

        await checkpoint(env)
        load_mixed = load_before()
        live = Live(env, live_rate, alone_s * 1.5 + 2, log_dir / "live-ids.txt")
        start, end = await _bulk(env, rows, live)
        mixed_s = end - start
        committed = await live.committed()
        deadline = time.monotonic() + 60
        while committed.keys() - received.keys():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(committed.keys() - received.keys())} live rows "
                                   "never arrived")
            await asyncio.sleep(0.05)
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
        "live_p50_ms": round(percentile(during, 50), 2) if during else None,
        "live_p95_ms": round(percentile(during, 95), 2) if during else None,
        "live_p99_ms": round(percentile(during, 99), 2) if during else None,
        "live_max_ms": round(max(during), 2) if during else None,
        "load_before_alone": load_alone, "load_before_beside": load_mixed,
    }
