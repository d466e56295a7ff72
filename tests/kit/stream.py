"""RabbitMQ streams for tests: a stream of the test's own (created, deleted afterwards) and a
reader of everything in it from offset `first`, over the stream protocol (rstream)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rstream import (
    AMQPMessage,
    Consumer,
    ConsumerOffsetSpecification,
    MessageContext,
    OffsetType,
    Producer,
    amqp_decoder,
)

import relay.streams.wire  # noqa: F401 - names outside ASCII, as the relay sends them
from tests.helpers import count_rows, pg_fetch

STREAM_HOST = os.environ.get("RELAY_TEST_STREAM_HOST", "127.0.0.1")
STREAM_PORT = int(os.environ.get("RELAY_TEST_STREAM_PORT", "5552"))
CREDENTIALS = {"username": "guest", "password": "guest"}
STREAM_TABLE = "queue_message_stream"


async def insert_stream_rows(dsn: str, stream: str, n: int) -> list[str]:
    """n rows for `stream` in one statement (the producer's INSERT, as docs/streams.md shows
    it); their ids in row order."""
    rows = await pg_fetch(
        dsn, f"INSERT INTO {STREAM_TABLE} (stream, content) "
        "SELECT $1, jsonb_build_object('n', g) FROM generate_series(1, $2) AS g "
        "RETURNING id::text", stream, n)
    return [r["id"] for r in rows]


async def stream_table_empty(dsn: str) -> bool:
    """Every stream row was sent (or parked)."""
    return await count_rows(dsn, STREAM_TABLE) == 0


@asynccontextmanager
async def a_stream(name: str, *, port: int = STREAM_PORT) -> AsyncIterator[str]:
    """A new stream named `name` (on the node whose stream port is `port`), deleted at the
    end."""
    producer = Producer(STREAM_HOST, port, **CREDENTIALS)
    await producer.start()
    try:
        await producer.create_stream(name, exists_ok=True)
        yield name
    finally:
        try:
            await producer.delete_stream(name, missing_ok=True)
        finally:
            await producer.close()


async def read_stream(name: str, *, at_least: int, timeout_s: float = 60.0,
                      quiet_s: float = 1.0, port: int = STREAM_PORT) -> list[dict[str, Any]]:
    """Every message of the stream from its first offset: once `at_least` arrived, wait
    `quiet_s` more for any beyond (duplicates would show there). Each as a dict: id (the
    `x-outbox-id` property), message_id, body, offset."""
    got: list[dict[str, Any]] = []
    last_arrival = time.monotonic()

    async def on_message(message: AMQPMessage, context: MessageContext) -> None:
        nonlocal last_arrival
        props = message.application_properties or {}
        raw = props.get(b"x-outbox-id", props.get("x-outbox-id"))
        mid = message.properties.message_id if message.properties else None
        got.append({"id": raw.decode() if isinstance(raw, bytes) else raw,
                    "message_id": mid.decode() if isinstance(mid, bytes) else mid,
                    "body": b"".join(message.body) if isinstance(message.body, list)
                    else message.body,
                    "offset": context.offset})
        last_arrival = time.monotonic()

    consumer = Consumer(STREAM_HOST, port, **CREDENTIALS)
    await consumer.start()
    try:
        await consumer.subscribe(name, on_message, decoder=amqp_decoder,
                                 offset_specification=ConsumerOffsetSpecification(
                                     OffsetType.FIRST, None))
        deadline = time.monotonic() + timeout_s
        while len(got) < at_least or time.monotonic() - last_arrival < quiet_s:
            if time.monotonic() > deadline:
                raise AssertionError(f"stream {name}: {len(got)} of {at_least} messages after "
                                     f"{timeout_s:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        await consumer.close()
    return got
