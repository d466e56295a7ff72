"""A consumer process using the inbox, for chaos tests to kill:

    python -m tests.kit.inbox_consumer --amqp URL --dsn DSN --queue Q [--concurrency 8]
        [--max-attempts 5] [--poison ID]

Its handler writes one row per message into the business table `orders (message_id, n)` (no
unique key, so a second run of the handler would show as a second row) in the inbox's
transaction. It runs until SIGTERM; on SIGKILL whatever it handled and committed is in the
database and whatever it had not acked comes again. Each duplicate it skips is logged by the
inbox (logger relay.inbox) to stderr. With --poison, the handler ends the process at once
(os._exit, as an out-of-memory kill or a crash would) on the message whose id is ID.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
from typing import Any

from relay.inbox import ConsumerConfig, consume

BUSINESS_TABLE = "CREATE TABLE IF NOT EXISTS orders (message_id text NOT NULL, n int NOT NULL)"


async def record_order(message: Any, conn: Any) -> None:
    """The business write: the row's id and the body's length."""
    await conn.execute("INSERT INTO orders VALUES ($1, $2)",
                       message.headers.get("x-outbox-id") or message.message_id,
                       len(message.body))


POISON_EXIT = 3  # the exit status of a process the poison message ended


async def poisoned(poison: str, message: Any, conn: Any) -> None:
    """record_order, except for the message `poison`: the process ends in the handler."""
    if (message.headers.get("x-outbox-id") or message.message_id) == poison:
        os._exit(POISON_EXIT)
    await record_order(message, conn)


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    config = ConsumerConfig(queue=args.queue, prefetch=args.prefetch,
                            concurrency=args.concurrency, max_attempts=args.max_attempts)
    handler = functools.partial(poisoned, args.poison) if args.poison else record_order
    consumer = await consume(args.amqp, args.dsn, handler, config, stop)
    print(f"handled {consumer.handled} duplicates {consumer.duplicates}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.kit.inbox_consumer")
    parser.add_argument("--amqp", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--prefetch", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--poison", help="the id of a message whose handler ends the process")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main(parser.parse_args()))
