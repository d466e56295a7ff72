"""The machine's own latency floor, measured right before a latency run: what no relay can go
under on this machine at that moment.

    python -m bench.floor [--samples 200]

Three probes, one after another, each `--samples` times in sequence:

- `timer`: how late `asyncio.sleep(1 ms)` wakes (the VM's and the kernel's wake-up delay);
- `pg_commit`: one autocommitted `SELECT txid_current()` (a transaction with an id: a commit
  record flushed to disk) on the run's server, round trip included;
- `amqp_confirm`: one persistent message published to a durable classic queue on a confirm
  channel and its confirm awaited (the broker's fsync and its round trip).

Each gives p50 and p99 in ms. The commit-to-consumer path holds at least one commit and one
publish, so a run whose floor moved says so beside its latency (bench/compare.py prints the
floor per run). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import aio_pika
import asyncpg
import uvloop

from bench.common import AMQP_URL, PG_ADMIN_DSN, percentile


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


async def measure(samples: int = 200, dsn: str = PG_ADMIN_DSN) -> dict[str, Any]:
    """The three probes' p50 and p99 (ms); `dsn`: the server a run uses."""
    return {"timer_late": _summary(await _timer(samples)),
            "pg_commit": _summary(await _pg_commit(samples, dsn)),
            "amqp_confirm": _summary(await _amqp_confirm(samples))}


def brief(floor: dict[str, Any] | None) -> str:
    """`commit/confirm/timer p50 ms` for a table cell."""
    if not floor:
        return "-"
    return (f"{floor['pg_commit']['p50_ms']:.2f} / {floor['amqp_confirm']['p50_ms']:.2f} / "
            f"{floor['timer_late']['p50_ms']:.2f}")


def main() -> None:
    """Print one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(uvloop.run(measure(args.samples))))


if __name__ == "__main__":
    main()
