"""What caps the drain: the same backlog to one durable queue, four, and one transient queue.

    python -m bench.drain_cap --out bench/drain-cap-RESULTS.md [--rows 100000] [--runs 2]
        [--relays 1,2]

One relay drains about as fast as two while the machine's cores are not all busy; a bare
publisher reaches about twice the relay's rate. Each run drains the same backlog (committed in
one transaction, `relay run` at its defaults) to one of three destinations, in turn:

- `1 durable`: every message to one durable queue (what bench/drain.py measures);
- `4 durable`: the rows' routing keys spread over four durable queues, each its own queue
  process on the broker;
- `1 transient`: one queue that is not durable (the broker writes nothing to disk for it).

If the four queues drain faster than one, one queue's process is the cap; if the transient
queue drains faster than the durable one, the broker's disk writes are. The broker's CPU and
the relay's are reported beside each rate (bench/common.py cpu_split).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from bench.common import (
    AMQP_URL,
    BODY_SQL,
    BenchEnv,
    OneOff,
    Relay,
    cpu_split,
    delete_queues,
    load_before,
    one_off,
    one_off_env,
    wait_empty,
    wait_quiet,
)
from bench.server import run_on_private_server

DESTINATIONS = {"1 durable": (1, True), "4 durable": (4, True), "1 transient": (1, False)}


async def _bind(env: BenchEnv, name: str, queues: int, durable: bool) -> list[str]:
    """Declare and bind this destination's queues (routing keys cap-<name>-0..n-1)."""
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        exchange = await ch.get_exchange(env.exchange)
        names = []
        for i in range(queues):
            queue = f"{env.queue}-{name.replace(' ', '-')}-{i}"
            q = await ch.declare_queue(queue, durable=durable)
            await q.bind(exchange, _key(name, i))
            names.append(queue)
        return names
    finally:
        await amqp.close()


def _key(name: str, i: int) -> str:
    return f"cap-{name.replace(' ', '-')}-{i}"


async def _queued(queues: list[str]) -> int:
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        ch = await amqp.channel()
        total = 0
        for queue in queues:
            q = await ch.declare_queue(queue, passive=True)
            total += q.declaration_result.message_count or 0
        return total
    finally:
        await amqp.close()


async def drain_to(env: BenchEnv, name: str, rows: int, relays: int) -> dict[str, Any]:
    """One drain of `rows` rows to destination `name`; msg/s and the CPU split."""
    queues, durable = DESTINATIONS[name]
    names = await _bind(env, name, queues, durable)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-drain-cap-"))
    procs = [Relay(env.relay_env(), log_dir / f"relay-{i}.log") for i in range(relays)]
    conn = await asyncpg.connect(env.dsn)
    try:
        for proc in procs:
            await proc.wait_started()
        load = load_before()
        with cpu_split([p.proc.pid for p in procs]) as cpu:
            await conn.execute(
                "INSERT INTO queue_message (exchange, routing_key, content) "
                f"SELECT $1, $2 || (g % $3)::text, {BODY_SQL} "
                "FROM generate_series(1, $4) AS g",
                env.exchange, _key(name, 0)[:-1], queues, rows)
            committed = time.monotonic()
            await conn.execute("ANALYZE queue_message")
            deadline = committed + 600
            while await _queued(names) < rows:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: the backlog did not reach its queues in 600 s")
                await asyncio.sleep(0.05)
            emptied = await wait_empty(conn, max(deadline - time.monotonic(), 1.0))
        await conn.execute("VACUUM queue_message")
    finally:
        await conn.close()
        for proc in procs:
            proc.stop()
        await delete_queues(names)
    seconds = emptied - committed
    return {"destination": name, "relays": relays, "rows": rows,
            "msg_per_s": round(rows / seconds, 1), "cpu_cores": cpu, "load_before": load,
            "logs": str(log_dir)}


async def measure(rows: int, runs: int, relays: list[int],
                  quiet_below: float) -> list[dict[str, Any]]:
    """Every destination in turn, `runs` times, for each number of relays."""
    async with one_off_env("drain_cap") as (env, records):
        for n in relays:
            for i in range(runs):
                for name in DESTINATIONS:
                    await wait_quiet(quiet_below)
                    records.add({"run": i + 1, **await drain_to(env, name, rows, n)})
    return records


def report(records: list[dict[str, Any]], run: OneOff) -> str:
    """The Markdown results file."""
    lines = [
        *run.header(
            "What caps the drain: one durable queue, four, one transient",
            "PostgreSQL: a private initdb cluster with the server's defaults; RabbitMQ on "
            "loopback; `relay run` with its defaults; the backlog committed in one "
            "INSERT ... SELECT, ~200-byte JSON rows; nothing consumes during a drain; CPU in "
            "cores (CPU-seconds per second of the drain) from /proc"),
        "| run | relays | destination | rows | msg/s | relay cores | RabbitMQ cores "
        "| PostgreSQL cores | machine busy | load before |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        cpu = r["cpu_cores"]
        lines.append(
            f"| {r['run']} | {r['relays']} | {r['destination']} | {r['rows']:,} "
            f"| {r['msg_per_s']:,.0f} | {cpu.get('relay', 0):.2f} | {cpu.get('rabbitmq', 0):.2f} "
            f"| {cpu.get('postgres', 0):.2f} | {cpu.get('machine_busy', 0):.2f} "
            f"| {r['load_before'][0]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run = one_off("bench.drain_cap", runs=2, options={
        "--rows": {"type": int, "default": 100_000},
        "--relays": {"default": "1,2", "help": "numbers of relays, in turn"},
    })
    records = run_on_private_server(lambda: measure(
        args.rows, args.runs, [int(n) for n in args.relays.split(",")], args.quiet_below))
    run.write(args.out, report(records, run))


if __name__ == "__main__":
    main()
