"""End-to-end latency at a fixed commit rate: producer commit -> consumer receipt, `relay run`.

Three kinds of process, as a user runs them: producers (bench/producer.py: N connections, one
1-row transaction per commit, Poisson arrivals), the relay, and this process as the consumer.
The producer notes when each commit returned and the consumer when each message_id arrived,
both on CLOCK_MONOTONIC (one clock for every process of the machine). The first second is a
warm-up (prepared statements, connection start) and is left out of the percentiles.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench import common
from bench.common import AMQP_URL, BenchEnv, Relay, checkpoint, load_before, percentile

WARMUP_S = 1.0



async def produce(env: BenchEnv, rate: int, connections: int, seconds: float,
                   out: Path) -> dict[str, Any]:
    """bench/producer.py in its own process; its JSON report (commits, achieved_per_s)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.producer", "--dsn", env.dsn, "--exchange", env.exchange,
        "--rate", str(rate), "--connections", str(connections), "--seconds", str(seconds),
        "--out", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"producer failed: {stderr.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return result


async def latency_once(
    env: BenchEnv,
    rate_per_s: int,
    duration_s: float,
    *,
    connections: int = 4,
    log_dir: Path | None = None,
    **relay_overrides: Any,
) -> dict[str, Any]:
    """Producers at `rate_per_s` commits/s for `duration_s`; p50/p95/p99 in milliseconds.

    A CHECKPOINT first: the gigabytes an earlier scenario wrote (a 1,000,000-row backlog) are
    flushed before this run, not by a checkpoint in the middle of it (on the private cluster
    the 3,000 commits/s p99 was 29-55 ms right after the drains, 6 ms on a server at rest)."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-latency-"))
    await checkpoint(env)
    load = load_before()
    before = await measure_floor(dsn=env.dsn)
    relay = Relay(env.relay_env(**relay_overrides), log_dir / "relay.log")
    received: dict[str, float] = {}

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        received.setdefault(str(message.message_id), time.monotonic())

    amqp = await aio_pika.connect(AMQP_URL)
    try:
        channel = await amqp.channel()
        await channel.set_qos(prefetch_count=5000)
        queue = await channel.get_queue(env.queue)
        await queue.consume(on_message, no_ack=True)
        await relay.wait_started()
        produced = await produce(env, rate_per_s, connections, duration_s, log_dir / "ids.txt")
        committed = {}
        for line in (log_dir / "ids.txt").read_text().splitlines():
            row_id, t = line.split()
            committed[row_id] = float(t)
        deadline = time.monotonic() + 60
        while len(received.keys() & committed.keys()) < len(committed):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(committed) - len(received)} messages never arrived")
            await asyncio.sleep(0.05)
    finally:
        relay.stop()
        await amqp.close()
    start = min(committed.values())
    lat_ms = [(received[k] - t) * 1000 for k, t in committed.items() if t - start >= WARMUP_S]
    # Each row's commit time and latency, for reading where a tail comes from (log_dir).
    (log_dir / "latencies.txt").write_text("".join(
        f"{t - start:.6f} {(received[k] - t) * 1000:.3f}\n" for k, t in committed.items()))
    return {
        "rate_per_s": rate_per_s,
        "connections": connections,
        "achieved_per_s": produced["achieved_per_s"],
        "messages": len(lat_ms),
        "p50_ms": round(percentile(lat_ms, 50), 2),
        "p95_ms": round(percentile(lat_ms, 95), 2),
        "p99_ms": round(percentile(lat_ms, 99), 2),
        "max_ms": round(max(lat_ms), 2),
        "load_before": load,
        "floor": before,
    }


# The machine's own latency floor, measured right before each latency run: what no relay can
# go under on this machine at that moment. Three probes, one after another, each `samples`
# times in sequence: `timer_late`, how late `asyncio.sleep(1 ms)` wakes (the VM's and the
# kernel's wake-up delay); `pg_commit`, one autocommitted `SELECT txid_current()` (a commit
# record flushed to disk) on the run's server, round trip included; `amqp_confirm`, one
# persistent message to a durable classic queue on a confirm channel and its confirm awaited.
# The commit-to-consumer path holds at least one commit and one publish, so a run whose floor
# moved says so beside its latency.


def _summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {"p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3)}


async def _timer(samples: int) -> list[float]:
    late = []
    for _ in range(samples):
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
    return late


async def _pg_commit(samples: int, dsn: str) -> list[float]:
    conn = await asyncpg.connect(dsn)
    try:
        took = []
        for _ in range(samples):
            started = time.perf_counter()
            await conn.fetchval("SELECT txid_current()")
            took.append(time.perf_counter() - started)
        return took
    finally:
        await conn.close()


async def _amqp_confirm(samples: int) -> list[float]:
    conn = await aio_pika.connect(AMQP_URL)
    name = f"bench-floor-{uuid.uuid4().hex[:8]}"
    try:
        channel = await conn.channel(publisher_confirms=True)
        queue = await channel.declare_queue(name, durable=True)
        took = []
        for i in range(samples):
            message = aio_pika.Message(b'{"floor": %d}' % i,
                                       delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            started = time.perf_counter()
            await channel.default_exchange.publish(message, routing_key=name)
            took.append(time.perf_counter() - started)
        await queue.delete(if_unused=False, if_empty=False)
        return took
    finally:
        await conn.close()


async def measure_floor(samples: int = 200, dsn: str | None = None) -> dict[str, Any]:
    """The three probes' p50 and p99 (ms); `dsn`: the server a run uses."""
    return {"timer_late": _summary(await _timer(samples)),
            "pg_commit": _summary(await _pg_commit(samples, dsn or common.PG_ADMIN_DSN)),
            "amqp_confirm": _summary(await _amqp_confirm(samples))}


def brief_floor(floor: dict[str, Any] | None) -> str:
    """`commit/confirm/timer p50 ms` for a table cell."""
    if not floor:
        return "-"
    return (f"{floor['pg_commit']['p50_ms']:.2f} / {floor['amqp_confirm']['p50_ms']:.2f} / "
            f"{floor['timer_late']['p50_ms']:.2f}")
