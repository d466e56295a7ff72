"""Effectively once, two scenarios with reports of their own, each alternating two kinds of run
on a private cluster with the server's defaults (bench/common.py).

    python -m bench --scenario inbox -- [--messages 20000] [--runs 3] [--concurrency 8]
    python -m bench --scenario streams -- [--rows 100000] [--runs 3]

inbox: a consumer with the inbox beside the same consumer without it, messages handled per
second. Both take the same messages from a durable queue (published beforehand, persistent, each
with an `x-outbox-id` as the relay sends it), with the same prefetch and handlers at once, each
handler writing one business row in a transaction and acking after the commit; the inbox adds
its record to that transaction (relay.inbox). Writes its block of bench/RESULTS.md.

streams: a backlog of `--rows` rows of ~200 bytes committed at once, drained by one `relay run`
with its defaults into the scenario's durable classic queue (the outbox, as bench/drain.py) and
then into a stream (the stream table, RELAY_STREAMS=true, every producer slot to this relay);
rows per second from the commit to the table's last delete. Then the latency of single rows to
an idle relay (`--latency-rows` one-row transactions, Poisson arrivals at 20/s: commit returned
to a stream consumer's receipt, from a relay just started: every row counts, each slot's first
message to the stream among them), woken by the NOTIFY of the stream table's trigger (the
default) and, alternating, with that trigger disabled (the slots' polling alone). Writes its
block of bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from aio_pika.abc import AbstractIncomingMessage
from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    amqp_decoder,
)

from bench.common import (
    AMQP_URL,
    BODY_SQL,
    BenchEnv,
    Receipts,
    Relay,
    alternate,
    alternation_table,
    create_env,
    drop_env,
    load_before,
    one_off,
    run_on_private_server,
    tail_ms,
)
from bench.drain import drain_once
from relay.inbox import ConsumerConfig, InboxConsumer, migrate
from tests.kit.stream import CREDENTIALS, STREAM_HOST, STREAM_PORT, a_stream

BUSINESS = "CREATE TABLE IF NOT EXISTS orders (message_id text NOT NULL, body jsonb NOT NULL)"


# ---------------------------------------------------------------------- the inbox


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


async def consume_once(kind: str, env: BenchEnv, messages: int,
                       config: ConsumerConfig) -> dict[str, Any]:
    """On a fresh business table, publish `messages`, then time one consumer taking them all."""
    conn = await asyncpg.connect(env.dsn)
    try:
        await conn.execute("TRUNCATE orders, relay_inbox; CHECKPOINT")
    finally:
        await conn.close()
    await _publish(env.queue, messages)
    consumer: InboxConsumer | PlainConsumer = (
        InboxConsumer(AMQP_URL, env.dsn, business_write, config) if kind == "inbox"
        else PlainConsumer(env.dsn, config))
    load = load_before()
    stop = asyncio.Event()
    started = time.monotonic()
    task = asyncio.create_task(consumer.run(stop))
    while consumer.handled < messages:
        if task.done() or time.monotonic() > started + 600:
            task.result() if task.done() else None
            raise TimeoutError(f"{kind}: {consumer.handled} of {messages} handled")
        await asyncio.sleep(0.01)
    seconds = time.monotonic() - started
    stop.set()
    await task
    return {"messages": messages, "seconds": round(seconds, 3),
            "msg_per_s": round(messages / seconds, 1), "load_before": load}


async def inbox_runs(messages: int, runs: int, concurrency: int, prefetch: int,
                     quiet_below: float) -> list[dict[str, Any]]:
    """Alternate the consumer without and with the inbox `runs` times."""
    env = await create_env("inbox")
    try:
        config = ConsumerConfig(queue=env.queue, concurrency=concurrency, prefetch=prefetch)
        conn = await asyncpg.connect(env.dsn)
        try:
            await migrate(conn)
            await conn.execute(BUSINESS)
        finally:
            await conn.close()
        return await alternate(runs, {
            kind: lambda kind=kind: consume_once(kind, env, messages, config)  # type: ignore[misc]
            for kind in ("plain", "inbox")}, "consumer", quiet_below)
    finally:
        await drop_env(env)


def inbox_main() -> None:
    """`--scenario inbox`: parse its options, run on a private cluster, write its report."""
    args, run = one_off("bench.once", scenario="inbox", runs=3, options={
                            "--messages": {"type": int, "default": 20_000},
                            "--concurrency": {"type": int, "default": 8},
                            "--prefetch": {"type": int, "default": 100}})
    results = run_on_private_server(lambda: inbox_runs(
        args.messages, args.runs, args.concurrency, args.prefetch, args.quiet_below))
    lines = run.header(
        "A consumer with the inbox beside the same consumer without it",
        "server: a private initdb cluster with the server's defaults (synchronous_commit on); "
        "RabbitMQ on loopback, a durable classic queue, persistent messages of ~200 bytes",
        f"consumer: prefetch {args.prefetch}, {args.concurrency} handlers at once, each a "
        "transaction with one business row, ack after commit")
    lines += alternation_table(results, "consumer", "messages", "plain", "inbox")
    run.write(args.out, "\n".join(lines) + "\n")


# ---------------------------------------------------------------------- streams


async def stream_drain_once(env: BenchEnv, stream: str, rows: int) -> dict[str, Any]:
    """One drain of `rows` stream rows through one relay."""
    relay = Relay(env.relay_env(streams="true"),
                  Path(tempfile.mkdtemp(prefix="bench-streams-")) / "relay.log")
    conn = await asyncpg.connect(env.dsn)
    try:
        await relay.wait_started()
        load = load_before()
        await conn.execute(
            f"INSERT INTO queue_message_stream (stream, content) "
            f"SELECT $1, {BODY_SQL} FROM generate_series(1, $2) AS g", stream, rows)
        committed = time.monotonic()
        await conn.execute("ANALYZE queue_message_stream")
        while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM queue_message_stream)"):
            if time.monotonic() > committed + 900:
                raise TimeoutError("stream table not drained after 900 s")
            await asyncio.sleep(0.01)
        seconds = time.monotonic() - committed
        await conn.execute("VACUUM queue_message_stream")
    finally:
        await conn.close()
        relay.stop()
    return {"rows": rows, "seconds": round(seconds, 3), "msg_per_s": round(rows / seconds, 1),
            "load_before": load}


async def classic_drain_once(env: BenchEnv, rows: int) -> dict[str, Any]:
    """One drain of `rows` outbox rows into the classic queue through one relay."""
    drained = await drain_once(env, rows)
    return {"rows": rows, **{k: drained[k] for k in ("seconds", "msg_per_s", "load_before")}}


async def stream_latency_once(env: BenchEnv, stream: str, rows: int,
                              notify: bool) -> dict[str, Any]:
    """`rows` one-row transactions to an idle relay, 20 a second; commit to receipt, in ms."""
    received = Receipts()

    async def on_message(message: AMQPMessage, _: MessageContext) -> None:
        raw = (message.application_properties or {}).get(b"x-outbox-id")
        if isinstance(raw, bytes):
            received.setdefault(raw.decode(), time.monotonic())

    relay = Relay(env.relay_env(streams="true"),
                  Path(tempfile.mkdtemp(prefix="bench-streams-")) / "relay.log")
    consumer = Consumer(STREAM_HOST, STREAM_PORT, **CREDENTIALS)
    conn = await asyncpg.connect(env.dsn)
    sent: dict[str, float] = {}
    try:
        switch = "ENABLE" if notify else "DISABLE"
        await conn.execute(f"ALTER TABLE queue_message_stream {switch} TRIGGER "
                           "queue_message_stream_notify")
        await consumer.start()
        await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.NEXT, None))
        await relay.wait_started()
        rng = random.Random(41)
        await asyncio.sleep(2.0)  # idle: every slot found nothing
        load = load_before()
        for _ in range(rows):
            row_id = await conn.fetchval(
                "INSERT INTO queue_message_stream (stream, content) "
                f"SELECT $1, {BODY_SQL} FROM generate_series(1, 1) AS g RETURNING id::text",
                stream)
            sent[row_id] = time.monotonic()
            await asyncio.sleep(rng.expovariate(20.0))
        await received.wait_for(sent)
    finally:
        await conn.execute("ALTER TABLE queue_message_stream "
                           "ENABLE TRIGGER queue_message_stream_notify")
        await conn.close()
        await consumer.close()
        relay.stop()
    ms = [(received[i] - t) * 1000 for i, t in sent.items()]
    return {"rows": rows, "load_before": load, **tail_ms(ms)}


async def stream_runs(rows: int, runs: int, latency_rows: int, quiet_below: float,
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Alternate classic and stream drains `runs` times, then the latency runs."""
    env = await create_env("streams")
    try:
        async with a_stream(f"bench-{env.database}") as stream:
            drains = await alternate(runs, {
                "classic": lambda: classic_drain_once(env, rows),
                "stream": lambda: stream_drain_once(env, stream, rows)},
                "destination", quiet_below)
            latency = await alternate(runs, {
                kind: lambda notify=(kind == "notify"): stream_latency_once(  # type: ignore[misc]
                    env, stream, latency_rows, notify)
                for kind in ("notify", "poll")}, "wake-up", quiet_below)
        return drains, latency
    finally:
        await drop_env(env)


def streams_main() -> None:
    """`--scenario streams`: parse its options, run on a private cluster, write its report."""
    args, run = one_off("bench.once", scenario="streams", runs=3,
                        options={"--rows": {"type": int, "default": 100_000},
                                 "--latency-rows": {"type": int, "default": 200}})
    results, latency = run_on_private_server(lambda: stream_runs(
        args.rows, args.runs, args.latency_rows, args.quiet_below))
    lines = run.header(
        "Rows into a stream beside the same rows into a classic queue",
        "server: a private initdb cluster with the server's defaults; RabbitMQ on loopback",
        "one `relay run` with its defaults; a backlog committed at once; classic: the outbox "
        "to a durable classic queue (persistent messages, publisher confirms); stream: the "
        "stream table over the stream protocol (RELAY_STREAMS=true, 4 producer slots, all to "
        "this relay), deduplicated by the broker")
    lines += alternation_table(results, "destination", "rows", "classic", "stream")
    lines += ["", "### One row at a time to an idle relay (commit to a stream consumer's receipt, "
              "ms)", "", "notify: the default (the stream table's trigger wakes a sleeping "
              "relay); poll: the trigger disabled, the slots' own polling alone (every 50 ms "
              "backing off to 0.5 s). Every row counts, from a relay just started: each slot's "
              "first message to the stream (it declares the slot's publisher there) among "
              "them.", "",
              "| run | wake-up | rows | p50 | p95 | p99 | max | load before |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['wake-up']} | {r['rows']} | {r['p50_ms']} | {r['p95_ms']} | "
              f"{r['p99_ms']} | {r['max_ms']} | {r['load_before'][0]} |" for r in latency]
    run.write(args.out, "\n".join(lines) + "\n")
