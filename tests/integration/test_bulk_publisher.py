"""The bulk publish path against a real RabbitMQ: acks, returns, nacks, missing exchanges and
connection loss each settle the right rows."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from relay.amqp.bulk import BulkPublisher
from relay.interfaces import Message
from relay.options import Properties
from tests.helpers import Consumer, Env, count_rows, insert_rows, wait_until


def _messages(
    exchange: str, key: str, n: int, props: Properties | None = None, mandatory: bool = True
) -> list[Message]:
    p = props or Properties()
    return [
        Message(str(uuid.uuid4()), exchange, key, b'{"n": %d}' % i, p, mandatory)
        for i in range(n)
    ]


async def _publisher(url: str) -> BulkPublisher:
    pub = BulkPublisher(url, publish_timeout_s=15, reconnect_max_s=1)
    await pub.connect()
    return pub


@pytest.fixture
async def publisher(amqp_url: str) -> AsyncIterator[BulkPublisher]:
    pub = await _publisher(amqp_url)
    try:
        yield pub
    finally:
        await pub.close()


async def test_bulk_publish__acked_batches_in_flight_together_are_confirmed_and_delivered(
    publisher: BulkPublisher, broker_names: tuple[str, str], amqp_url: str
) -> None:
    exchange, queue = broker_names
    batches = [_messages(exchange, "rk", 700) for _ in range(4)]
    results = await asyncio.gather(*(publisher.publish(b) for b in batches))
    for batch, result in zip(batches, results, strict=True):
        assert sorted(result.confirmed) == sorted(m.id for m in batch)
        assert not result.failed
        assert not result.unsent
    consumer = await Consumer(amqp_url, queue).start()
    try:
        await consumer.wait_for(2800)
        assert sorted(consumer.ids()) == sorted(m.id for b in batches for m in b)
    finally:
        await consumer.stop()


async def test_bulk_publish__returned_mandatory_message_fails_only_its_row(
    publisher: BulkPublisher, broker_names: tuple[str, str]
) -> None:
    exchange, _ = broker_names
    good = _messages(exchange, "rk", 50)
    lost = _messages(exchange, "no-queue-bound", 3)
    # The producer chose its own message_id: the row id travels in a header and still ties.
    custom = _messages(exchange, "no-queue-bound", 1, Properties(message_id="producer-chosen"))
    batch = good[:20] + lost + custom + good[20:]
    result = await publisher.publish(batch)
    assert sorted(result.confirmed) == sorted(m.id for m in good)
    assert set(result.failed) == {m.id for m in lost + custom}
    assert all(r.startswith("unroutable") for r in result.failed.values())
    assert not result.unsent


async def test_bulk_publish__nacked_messages_fail_and_the_rest_are_confirmed(
    publisher: BulkPublisher, broker_names: tuple[str, str], amqp_url: str
) -> None:
    exchange, _ = broker_names
    full = f"{exchange}-full"
    conn = await aio_pika.connect(amqp_url)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(
            full, arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
        )
        await q.bind(exchange, "full")
        accepted = _messages(exchange, "full", 2)
        refused = _messages(exchange, "full", 5)
        good = _messages(exchange, "rk", 10)
        result = await publisher.publish(accepted + refused + good)
        assert sorted(result.confirmed) == sorted(m.id for m in accepted + good)
        assert result.failed == {m.id: "nacked by the broker" for m in refused}
        await q.delete(if_unused=False, if_empty=False)
    finally:
        await conn.close()


async def test_bulk_publish__exchange_deleted_after_check_fails_only_its_rows(
    publisher: BulkPublisher, broker_names: tuple[str, str], amqp_url: str
) -> None:
    exchange, _ = broker_names
    doomed = f"{exchange}-doomed"
    conn = await aio_pika.connect(amqp_url)
    try:
        ch = await conn.channel()
        await ch.declare_exchange(doomed, aio_pika.ExchangeType.FANOUT)
        first = await publisher.publish(_messages(doomed, "", 2, mandatory=False))
        assert len(first.confirmed) == 2  # the exchange is now in the publisher's cache
        await ch.exchange_delete(doomed)
    finally:
        await conn.close()
    good = _messages(exchange, "rk", 300)
    bad = _messages(doomed, "", 5, mandatory=False)
    # The 404 closes the channel mid-batch; unconfirmed rows are sent again on a new one.
    result = await publisher.publish(good[:100] + bad + good[100:])
    assert sorted(result.confirmed) == sorted(m.id for m in good)
    assert result.failed == {m.id: f"exchange {doomed!r} not found" for m in bad}
    assert not result.unsent
    again = await publisher.publish(_messages(exchange, "rk", 10))
    assert len(again.confirmed) == 10


class _CuttableProxy:
    """A TCP proxy to RabbitMQ that can hold the broker's replies and then cut the line."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.hold_replies = False
        self.bytes_up = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        u_reader, u_writer = await asyncio.open_connection(*self.upstream)
        self._writers += [c_writer, u_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            try:
                while data := await src.read(65536):
                    if up:
                        self.bytes_up += len(data)
                    elif self.hold_replies:
                        continue  # swallowed: the client never hears these confirms
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(c_reader, u_writer, True), pump(u_reader, c_writer, False))

    def cut(self) -> None:
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()
        self.hold_replies = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


async def test_bulk_publish__connection_lost_before_confirms_leaves_batch_unsent(
    amqp_url: str, broker_names: tuple[str, str]
) -> None:
    exchange, _ = broker_names
    parts = urlsplit(amqp_url)
    proxy = _CuttableProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    port = await proxy.start()
    url = urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{port}"))
    publisher = await _publisher(url)
    try:
        assert len((await publisher.publish(_messages(exchange, "rk", 5))).confirmed) == 5
        proxy.hold_replies = True
        sent_before = proxy.bytes_up
        batch = _messages(exchange, "rk", 500)
        task = asyncio.ensure_future(publisher.publish(batch))
        await wait_until(lambda: proxy.bytes_up - sent_before > 500 * 100, what="batch written")
        proxy.cut()
        result = await asyncio.wait_for(task, timeout=30)
        assert result.confirmed == []
        assert sorted(result.unsent) == sorted(m.id for m in batch)
        assert result.broker_lost
        await wait_until(lambda: not publisher.ready, timeout_s=10, what="outage noticed")
        await asyncio.wait_for(publisher.wait_ready(), timeout=30)
        assert len((await publisher.publish(_messages(exchange, "rk", 5))).confirmed) == 5
    finally:
        await publisher.close()
        await proxy.close()


async def test_relay_run_with_bulk_publisher__deletes_delivered_rows_and_keeps_unroutable_ones(
    env: Env, consumer: Consumer, start_relay
) -> None:
    good = await insert_rows(env.pg_dsn, env.exchange, env.routing_key,
                             [{"n": i} for i in range(1200)])
    bad = await insert_rows(env.pg_dsn, env.exchange, "no-queue-bound", [{"bad": 1}])
    relay = start_relay(publisher="bulk", batch_size=500, retry_base_s=60)
    await consumer.wait_for(1200, timeout_s=60)
    await wait_until(lambda: _rows_left_are(env.pg_dsn, bad), timeout_s=60,
                     what="only the unroutable row left")
    assert sorted(consumer.ids()) == sorted(good)
    assert await count_rows(env.pg_dsn) == 1
    assert relay.terminate() == 0


async def _rows_left_are(dsn: str, ids: list[str]) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT id::text, attempts, last_error FROM queue_message")
    finally:
        await conn.close()
    return (sorted(r["id"] for r in rows) == sorted(ids)
            and all(r["attempts"] == 1 and r["last_error"].startswith("unroutable") for r in rows))
