"""End-to-end latency at a fixed commit rate: producer commit -> consumer receipt, `relay run`.

Three kinds of process, as a user runs them: producers (`ProducerProcess` below: N connections,
one 1-row transaction per commit, Poisson arrivals), the relay, and this process as the consumer.
The producer notes when each commit returned and the consumer when each message_id arrived,
both on CLOCK_MONOTONIC (one clock for every process of the machine). The first second is a
warm-up (prepared statements, connection start) and is left out of the percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
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
    checkpoint,
    load_before,
    percentile,
    tail_ms,
)

WARMUP_S = 1.0


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
    received = Receipts()
    producer = ProducerProcess(env, rate_per_s, duration_s, log_dir / "ids.txt",
                               connections=connections)
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        await received.consume(amqp, env.queue, prefetch=5000)
        await relay.wait_started()
        await producer.start()
        committed = await producer.committed()
        await received.wait_for(committed)
    finally:
        relay.stop()
        await amqp.close()
    start = min(committed.values())
    lat_ms = [(received[k] - t) * 1000 for k, t in committed.items() if t - start >= WARMUP_S]
    # Each row's commit time and latency, for reading where a tail comes from (log_dir).
    (log_dir / "latencies.txt").write_text("".join(
        f"{t - start:.6f} {(received[k] - t) * 1000:.3f}\n" for k, t in committed.items()))
    assert producer.report is not None
    return {
        "rate_per_s": rate_per_s,
        "connections": connections,
        "achieved_per_s": producer.report["achieved_per_s"],
        "messages": len(lat_ms),
        **tail_ms(lat_ms),
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


# ---------------------------------------------------------------------- the producers

INSERT = (
    "INSERT INTO queue_message (exchange, routing_key, content) VALUES ($1, $2, $3::jsonb) "
    "RETURNING id::text"
)
BODY = (
    '{"order_id": 123456, "customer": "customer-12", "sku": "SKU-012345", "qty": 3, '
    '"amount_cents": 45678, "currency": "EUR", "note": "' + "x" * 64 + '", '
    '"created": "2026-01-01T00:00:00Z"}'
)


async def produce(dsn: str, exchange: str, rate: float, connections: int,
                  seconds: float, *, routing_key: str = ROUTING_KEY,
                  ) -> tuple[list[tuple[str, float]], float]:
    """Commit at `rate` per second over `connections` for `seconds`; (id, commit time) pairs."""
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    out: list[tuple[str, float]] = []
    per_conn = rate / connections
    start = time.monotonic() + 0.05
    end = start + seconds

    async def one(conn: asyncpg.Connection, seed: int) -> None:
        rnd = random.Random(seed)
        due = start + rnd.expovariate(per_conn)
        while due < end:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            row_id = await conn.fetchval(INSERT, exchange, routing_key, BODY)
            out.append((row_id, time.monotonic()))
            due += rnd.expovariate(per_conn)

    try:
        await asyncio.gather(*(one(c, i) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    last = max((t for _, t in out), default=start + seconds)
    return out, max(last - start, seconds)


@dataclass
class ProducerProcess:
    """Producers in a process of their own (this module's main): `rate` commits a second for
    `seconds` on `connections` to `env`'s exchange, each connection on an open-loop Poisson
    schedule (a commit that falls behind is sent at once, never skipped); after each commit
    returns, the row's id and commit time (CLOCK_MONOTONIC) go to `out`, one `id time` line
    per row, and a JSON line with the achieved rate to stdout."""

    env: BenchEnv
    rate: int
    seconds: float
    out: Path
    connections: int = 1
    routing_key: str = ROUTING_KEY
    proc: asyncio.subprocess.Process | None = None
    report: dict[str, Any] | None = None  # its JSON line: commits, achieved_per_s

    async def start(self) -> None:
        """Start producing."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.latency", "--dsn", self.env.dsn,
            "--exchange", self.env.exchange, "--rate", str(self.rate),
            "--connections", str(self.connections), "--seconds", str(self.seconds),
            "--routing-key", self.routing_key, "--out", str(self.out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def committed(self) -> dict[str, float]:
        """Wait for the producer to end; each row's commit time (CLOCK_MONOTONIC), by id."""
        assert self.proc is not None
        stdout, stderr = await self.proc.communicate()
        if self.proc.returncode != 0:
            raise RuntimeError(f"producer failed: {stderr.decode()[-2000:]}")
        self.report = json.loads(stdout.decode().strip().splitlines()[-1])
        pairs = (line.split() for line in self.out.read_text().splitlines())
        return {row_id: float(t) for row_id, t in pairs}


def producer_main(argv: list[str] | None = None) -> int:
    """The producer process: parse flags, produce, write the ids and times."""
    parser = argparse.ArgumentParser(prog="python -m bench.latency",
                                     description=ProducerProcess.__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--exchange", required=True)
    parser.add_argument("--rate", type=float, required=True, help="commits per second")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--routing-key", default=ROUTING_KEY)
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    rows, elapsed = runner(produce(args.dsn, args.exchange, args.rate, args.connections,
                                   args.seconds, routing_key=args.routing_key))
    args.out.write_text("".join(f"{i} {t!r}\n" for i, t in rows))
    print(json.dumps({"commits": len(rows), "achieved_per_s": round(len(rows) / elapsed, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(producer_main())
