"""Demo consumer: declares the demo exchange and queue, then prints every message that arrives."""

from __future__ import annotations

import asyncio
import os

import aio_pika

EXCHANGE = "demo.events"
QUEUE = "demo.printer"


async def main() -> None:
    """Connect (retrying while the broker starts), declare, consume, print."""
    url = os.environ.get("AMQP_URL", "amqp://guest:guest@localhost:5672/")
    while True:
        try:
            conn = await aio_pika.connect_robust(url)
            break
        except OSError:
            await asyncio.sleep(2)
    channel = await conn.channel()
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(QUEUE, durable=True)
    await queue.bind(exchange, "#")
    print(f"consuming {QUEUE} (bound to {EXCHANGE} #)", flush=True)
    seen = 0
    async with queue.iterator() as messages:
        async for message in messages:
            async with message.process():
                seen += 1
                print(f"#{seen} id={message.message_id} key={message.routing_key} "
                      f"body={message.body.decode()[:200]}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
