"""A consumer with the inbox beside the same consumer without it: messages handled per second.

    python -m bench --scenario inbox -- [--messages 20000] [--runs 3] [--concurrency 8]

Both consumers take the same messages from a durable queue (published beforehand, persistent,
each with an `x-outbox-id` as the relay sends it), with the same prefetch and the same number of
handlers at once, each handler on a connection of its own writing one business row in a
transaction and acking after the commit. The inbox adds its record to that transaction
(relay.inbox); without it, nothing else changes. Runs alternate; on a private cluster with the
server's defaults (bench/common.py). Writes bench/inbox-RESULTS.md.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from bench.common import (
    AMQP_URL,
    OneOff,
    create_env,
    drop_env,
    load_before,
    one_off,
    run_on_private_server,
    wait_quiet,
)
from relay.inbox import ConsumerConfig, InboxConsumer, migrate

BUSINESS = "CREATE TABLE IF NOT EXISTS orders (message_id text NOT NULL, body jsonb NOT NULL)"


async def business_write(message: Any, conn: Any) -> None:
    """What a handler does: one row of the message's id and body."""
    await conn.execute("INSERT INTO orders VALUES ($1, $2::jsonb)",
                       message.headers["x-outbox-id"], message.body.decode())


async def _publish(queue: str, n: int) -> None:
    amqp = await aio_pika.connect(AMQP_URL)
    try:
        channel = await amqp.channel()
        for i in range(n):
            row_id = str(uuid.uuid4())
            await channel.default_exchange.publish(aio_pika.Message(
                b'{"order_id": %d, "amount_cents": 1250, "currency": "EUR", "note": "%s"}'
                % (i, b"x" * 120), headers={"x-outbox-id": row_id}, message_id=row_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue)
    finally:
        await amqp.close()


class PlainConsumer:
    """The same consumer without the inbox: transaction, business write, commit, ack."""

    def __init__(self, dsn: str, config: ConsumerConfig) -> None:
        self.dsn, self.config, self.handled = dsn, config, 0

    async def run(self, stop: asyncio.Event) -> None:
        pool = await asyncpg.create_pool(self.dsn, min_size=1,
                                         max_size=self.config.concurrency)
        slots = asyncio.Semaphore(self.config.concurrency)
        amqp = await aio_pika.connect_robust(AMQP_URL)

        async def one(message: AbstractIncomingMessage) -> None:
            async with slots:
                async with pool.acquire() as conn, conn.transaction():
                    await business_write(message, conn)
                self.handled += 1
                await message.ack()

        try:
            channel = await amqp.channel()
            await channel.set_qos(prefetch_count=self.config.prefetch)
            queue = await channel.get_queue(self.config.queue)
            await queue.consume(one)
            await stop.wait()
        finally:
            await amqp.close()
            await pool.close()


async def consume_once(kind: str, dsn: str, queue: str, messages: int,
                       config: ConsumerConfig) -> dict[str, Any]:
    """Publish `messages`, then time one consumer taking them all."""
    await _publish(queue, messages)
    consumer: InboxConsumer | PlainConsumer = (
        InboxConsumer(AMQP_URL, dsn, business_write, config) if kind == "inbox"
        else PlainConsumer(dsn, config))
    load = load_before()
    stop = asyncio.Event()
    started = time.monotonic()
    task = asyncio.create_task(consumer.run(stop))
    deadline = started + 600
    while consumer.handled < messages:
        if task.done() or time.monotonic() > deadline:
            task.result() if task.done() else None
            raise TimeoutError(f"{kind}: {consumer.handled} of {messages} handled")
        await asyncio.sleep(0.01)
    seconds = time.monotonic() - started
    stop.set()
    await task
    return {"consumer": kind, "messages": messages, "seconds": round(seconds, 3),
            "msg_per_s": round(messages / seconds, 1), "load_before": load}


async def run(messages: int, runs: int, concurrency: int, prefetch: int,
              quiet_below: float) -> list[dict[str, Any]]:
    """Alternate the two consumers `runs` times, each on a fresh business table."""
    env = await create_env("inbox")
    out = []
    try:
        config = ConsumerConfig(queue=env.queue, concurrency=concurrency, prefetch=prefetch)
        conn = await asyncpg.connect(env.dsn)
        try:
            await migrate(conn)
            await conn.execute(BUSINESS)
            for i in range(runs):
                for kind in ("plain", "inbox"):
                    await conn.execute("TRUNCATE orders, relay_inbox; CHECKPOINT")
                    await wait_quiet(quiet_below)
                    result = await consume_once(kind, env.dsn, env.queue, messages, config)
                    result["run"] = i + 1
                    print(result, flush=True)
                    out.append(result)
        finally:
            await conn.close()
    finally:
        await drop_env(env)
    return out


def report(results: list[dict[str, Any]], run_: OneOff, concurrency: int,
           prefetch: int) -> str:
    """The Markdown results file, with the ratio of each run pair."""
    lines = run_.header(
        "A consumer with the inbox beside the same consumer without it",
        "server: a private initdb cluster with the server's defaults (synchronous_commit on); "
        "RabbitMQ on loopback, a durable classic queue, persistent messages of ~200 bytes",
        f"consumer: prefetch {prefetch}, {concurrency} handlers at once, each a transaction "
        "with one business row, ack after commit")
    lines += ["| run | consumer | messages | seconds | msg/s | load before |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['consumer']} | {r['messages']:,} | {r['seconds']} | "
              f"{r['msg_per_s']:,.0f} | {r['load_before'][0]} |" for r in results]
    pairs = {}
    for r in results:
        pairs.setdefault(r["run"], {})[r["consumer"]] = r["msg_per_s"]
    ratios = [p["inbox"] / p["plain"] for p in pairs.values() if {"inbox", "plain"} <= p.keys()]
    if ratios:
        lines += ["", "Inbox over plain, run by run: "
                  + ", ".join(f"{x:.2f}" for x in ratios)
                  + f" (median {sorted(ratios)[len(ratios) // 2]:.2f})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse arguments, run on a private cluster, write the report."""
    args, run_ = one_off("bench.inbox", runs=3,
                         out=Path(__file__).with_name("inbox-RESULTS.md"), options={
                             "--messages": {"type": int, "default": 20_000},
                             "--concurrency": {"type": int, "default": 8},
                             "--prefetch": {"type": int, "default": 100}})
    results = run_on_private_server(lambda: run(args.messages, args.runs, args.concurrency,
                                                args.prefetch, args.quiet_below))
    run_.write(args.out, report(results, run_, args.concurrency, args.prefetch))


if __name__ == "__main__":
    main()
