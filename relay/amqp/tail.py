"""`relay tail`: a throwaway consumer that prints what arrives on an exchange (for people)."""

from __future__ import annotations

import asyncio
import json
import sys

import aio_pika

from relay.amqp.nodes import node_label, split_urls
from relay.dsn import redact
from relay.errors import BrokerError


async def _connect(amqp_url: str) -> aio_pika.abc.AbstractConnection:
    """The first node of RELAY_AMQP_URL's list that answers (in the list's order)."""
    errors = []
    for url in split_urls(amqp_url):
        try:
            return await aio_pika.connect(url)
        except (ConnectionError, OSError, aio_pika.exceptions.AMQPError) as exc:
            errors.append(f"{node_label(url)}: {exc or type(exc).__name__}")
    raise BrokerError(f"cannot reach RabbitMQ at {redact(amqp_url)}: {'; '.join(errors)}")


async def tail(amqp_url: str, exchange: str, binding_key: str, count: int | None) -> int:
    """Bind an exclusive queue to `exchange` and print each message as one JSON line."""
    conn = await _connect(amqp_url)
    seen = 0
    done = asyncio.Event()
    try:
        channel = await conn.channel()
        try:
            x = await channel.get_exchange(exchange, ensure=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            raise BrokerError(f"exchange {exchange!r} does not exist") from None
        queue = await channel.declare_queue(exclusive=True, auto_delete=True)
        await queue.bind(x, binding_key)
        print(f"tailing exchange {exchange!r} with binding key {binding_key!r}", file=sys.stderr,
              flush=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal seen
            seen += 1
            print(json.dumps({
                "message_id": message.message_id,
                "routing_key": message.routing_key,
                "content_type": message.content_type,
                "body": message.body.decode(errors="replace"),
            }), flush=True)
            if count is not None and seen >= count:
                done.set()

        await queue.consume(on_message, no_ack=True)
        await done.wait()
    finally:
        await conn.close()
    return seen
