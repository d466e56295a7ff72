"""Keyed vs unkeyed drain throughput of real `relay run` processes.

Usage: .venv/bin/python bench/ordering/bench.py [--rows 30000] [--reps 3] [--replicas 1]

Per scenario and repetition: a fresh migrated database, the relays started and idle, then all
rows inserted in one statement; the clock runs from that commit until the table is empty.
Scenarios run interleaved (rep 1 of all, then rep 2 ...) so that machine noise spreads evenly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP = os.environ.get("BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
RELAY = str(Path(sys.executable).with_name("relay"))
EXCHANGE = "bench-ordering-x"
QUEUE = "bench-ordering-q"

# name -> SQL expression of a row's ordering_key from g = 1..rows (NULL: unkeyed)
SCENARIOS: dict[str, str] = {
    "unkeyed": "NULL",
    "keyed, 10000 keys": "'k' || (g % 10000)",
    "keyed, 1000 keys": "'k' || (g % 1000)",
    "keyed, 50 keys": "'k' || (g % 50)",
    "hot key (50%) + 1000 keys": "CASE WHEN g % 2 = 0 THEN 'hot' ELSE 'k' || (g % 1000) END",
}


def dsn_for(db: str) -> str:
    """The admin DSN pointing at another database."""
    return ADMIN.rsplit("/", 1)[0] + "/" + db


def procs_dir(procs: list[subprocess.Popen[bytes]]) -> str:
    """Where the relays of a run log (for error messages)."""
    return str(getattr(procs[0], "logdir", "?")) if procs else "?"


def start_relays(env: dict[str, str], replicas: int) -> list[subprocess.Popen[bytes]]:
    """Migrate, then start `replicas` relay processes logging to a temporary folder."""
    subprocess.run([RELAY, "migrate"], env=env, check=True, capture_output=True)
    logdir = Path(tempfile.mkdtemp(prefix="bench-ordering-"))
    procs = []
    for i in range(replicas):
        with (logdir / f"relay-{i}.log").open("wb") as log:
            proc = subprocess.Popen([RELAY, "run"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
            proc.logdir = logdir  # type: ignore[attr-defined]
            procs.append(proc)
    return procs


async def one_run(name: str, key_sql: str, rows: int, replicas: int, rep: int) -> dict[str, Any]:
    """Drain `rows` rows of one scenario once; return elapsed seconds (and hot-key timings)."""
    db = f"bench_ordering_{os.getpid()}_{rep}_{abs(hash(name)) % 10000}"
    admin = await asyncpg.connect(ADMIN)
    await admin.execute(f'CREATE DATABASE "{db}"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(RELAY_PG_DSN=dsn_for(db), RELAY_AMQP_URL=AMQP, RELAY_LOG_LEVEL="warning",
               RELAY_LOG_FORMAT="json")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs = start_relays(env, replicas)
        conn = await asyncpg.connect(dsn_for(db))
        await asyncio.sleep(1.5)  # relays connected and idle
        started = time.perf_counter()
        await conn.execute(
            "INSERT INTO queue_message (exchange, routing_key, content, ordering_key) "
            f"SELECT $1, 'rk', jsonb_build_object('g', g), {key_sql} "
            "FROM generate_series(1, $2) g ORDER BY g",
            EXCHANGE, rows,
        )
        others_done = None
        while True:
            left, hot = await conn.fetchrow(
                "SELECT count(*), count(*) FILTER (WHERE ordering_key = 'hot') FROM queue_message"
            )
            now = time.perf_counter() - started
            if others_done is None and left - hot == 0:
                others_done = now
            if left == 0:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{name}: a relay exited (see its log in {procs_dir(procs)})")
            if now > 600:
                raise RuntimeError(f"{name}: {left} rows left after 600 s")
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        await conn.close()
        return {"elapsed_s": elapsed, "others_done_s": others_done}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


async def broker_setup(*, purge: bool, delete: bool = False) -> None:
    """Declare the bench exchange and queue (a fresh connection: the shared broker may restart)."""
    for _ in range(120):  # the shared broker may be restarting (other suites' chaos tests)
        try:
            amqp = await aio_pika.connect(AMQP)
            break
        except (ConnectionError, OSError, aio_pika.exceptions.AMQPConnectionError):
            await asyncio.sleep(1)
    else:
        raise RuntimeError("RabbitMQ did not come back within 120 s")
    try:
        channel = await amqp.channel()
        x = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
        q = await channel.declare_queue(QUEUE, durable=True)
        await q.bind(x, "rk")
        if purge:
            await q.purge()
        if delete:
            await channel.queue_delete(QUEUE)
            await channel.exchange_delete(EXCHANGE)
    finally:
        await amqp.close()


async def main() -> None:
    """Run every scenario `reps` times and print a Markdown table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SCENARIOS}
    for rep in range(args.reps):
        for name, key_sql in SCENARIOS.items():
            await broker_setup(purge=True)
            try:
                run = await one_run(name, key_sql, args.rows, args.replicas, rep)
            except RuntimeError as exc:  # the shared broker restarted under us: run it again
                print(f"rep {rep} {name}: {exc}; running it again", flush=True)
                await broker_setup(purge=True)
                run = await one_run(name, key_sql, args.rows, args.replicas, rep)
            results[name].append(run)
            print(f"rep {rep} {name}: {args.rows / run['elapsed_s']:.0f} rows/s", flush=True)
    await broker_setup(purge=True, delete=True)
    base = statistics.median(args.rows / r["elapsed_s"] for r in results["unkeyed"])
    print(f"\n{args.rows} rows, {args.replicas} relay process(es), concurrency 3, "
          f"batch 500, {args.reps} runs each\n")
    print("| scenario | median rows/s | min–max rows/s | ratio to unkeyed (median) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        rates = [args.rows / r["elapsed_s"] for r in runs]
        med = statistics.median(rates)
        print(f"| {name} | {med:,.0f} | {min(rates):,.0f}–{max(rates):,.0f} | "
              f"{med / base:.2f} |")
    hot = results["hot key (50%) + 1000 keys"]
    print("\nhot key scenario: other keys drained after "
          + ", ".join(f"{r['others_done_s']:.1f}s" for r in hot)
          + " of " + ", ".join(f"{r['elapsed_s']:.1f}s" for r in hot) + " total")


if __name__ == "__main__":
    asyncio.run(main())
