"""The publish pipeline against a real RabbitMQ, over both transports (bulk frames and
per-message): acks, returns, nacks, missing exchanges, forged ids, a silent broker and connection
loss each settle the right rows."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from relay.amqp.pipeline import AmqpPublisher, BulkPublisher, Pipeline
from relay.interfaces import Message, PublishResult, Reason
from relay.options import Properties
from tests.helpers import Env, count_rows, pg_fetch, wait_until
from tests.kit.consumer import Consumer
from tests.kit.producer import insert_rows
from tests.kit.proxy import proxy_for, via_proxy


def _messages(
    exchange: str, key: str, n: int, props: Properties | None = None, mandatory: bool = True
) -> list[Message]:
    p = props or Properties()
    return [
        Message(str(uuid.uuid4()), exchange, key, b'{"n": %d}' % i, p, mandatory)
        for i in range(n)
    ]


async def _publisher(url: str, kind: type[Pipeline] = BulkPublisher,
                     timeout_s: float = 15) -> Pipeline:
    pub = kind(url, publish_timeout_s=timeout_s, reconnect_max_s=1)  # type: ignore[call-arg]
    await pub.connect()
    return pub


@pytest.fixture(params=[BulkPublisher, AmqpPublisher], ids=["bulk", "per_message"])
async def publisher(amqp_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Pipeline]:
    pub = await _publisher(amqp_url, request.param)
    try:
        yield pub
    finally:
        await pub.close()


async def test_bulk_publish__acked_batches_in_flight_together_are_confirmed_and_delivered(
    publisher: Pipeline, broker_names: tuple[str, str], amqp_url: str
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
        assert sorted(consumer.ids) == sorted(m.id for b in batches for m in b)
    finally:
        await consumer.stop()


async def test_bulk_publish__returned_mandatory_message_fails_only_its_row(
    publisher: Pipeline, broker_names: tuple[str, str]
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
    assert {f.reason for f in result.failed.values()} == {Reason.UNROUTABLE}
    assert not result.unsent


async def test_publish__producer_ids_cannot_forge_another_rows_ack_or_return(
    publisher: Pipeline, broker_names: tuple[str, str]
) -> None:
    exchange, _ = broker_names
    good = _messages(exchange, "rk", 5)
    # Unroutable rows whose producer claims a routed row's identity: as its x-outbox-id header
    # (a return keyed on it would settle the wrong row) and as messageId (aiormq's own key).
    forged = [
        Message(str(uuid.uuid4()), exchange, "no-queue-bound", b"{}",
                Properties(headers={"x-outbox-id": good[0].id}), True),
        Message(str(uuid.uuid4()), exchange, "no-queue-bound", b"{}",
                Properties(message_id=good[1].id), True),
    ]
    # A routed row whose messageId is its own id.
    own = Message(str(uuid.uuid4()), exchange, "rk", b"{}", Properties(), True)
    own = Message(own.id, exchange, "rk", b"{}", Properties(message_id=own.id), True)
    result = await publisher.publish([*good, *forged, own])
    assert sorted(result.confirmed) == sorted([m.id for m in good] + [own.id])
    assert set(result.failed) == {m.id for m in forged}
    assert {f.reason for f in result.failed.values()} == {Reason.UNROUTABLE}


async def test_bulk_publish__nacked_messages_fail_and_the_rest_are_confirmed(
    publisher: Pipeline, broker_names: tuple[str, str], amqp_url: str
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
        assert {k: f.reason for k, f in result.failed.items()} == {
            m.id: Reason.NACKED for m in refused}
        await q.delete(if_unused=False, if_empty=False)
    finally:
        await conn.close()


async def test_bulk_publish__exchange_deleted_after_check_fails_only_its_rows(
    publisher: Pipeline, broker_names: tuple[str, str], amqp_url: str
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
    # The 404 closes the channel mid-batch; unconfirmed rows are sent again on a new one. With
    # per-message publishes already queued behind the closed channel, the broker drops the whole
    # connection (frames on a closed channel): those rows are unsent, and sent again after it.
    pending, result = good[:100] + bad + good[100:], PublishResult()
    for _ in range(3):
        this = await publisher.publish(pending)
        assert not this.refused
        assert set(this.unsent.values()) <= {Reason.BROKER_LOST}
        result.merge(this)
        pending = [m for m in pending if m.id in this.unsent]
        if not pending:
            break
        await asyncio.wait_for(publisher.wait_ready(), timeout=30)
    assert sorted(result.confirmed) == sorted(m.id for m in good)
    assert {k: f.reason for k, f in result.failed.items()} == {
        m.id: Reason.EXCHANGE_NOT_FOUND for m in bad}
    assert not pending
    again = await publisher.publish(_messages(exchange, "rk", 10))
    assert len(again.confirmed) == 10


@pytest.mark.parametrize("kind", [BulkPublisher, AmqpPublisher], ids=["bulk", "per_message"])
async def test_publish__connection_lost_before_confirms_leaves_batch_unsent(
    amqp_url: str, broker_names: tuple[str, str], kind: type[Pipeline]
) -> None:
    exchange, _ = broker_names
    proxy = await proxy_for(amqp_url)
    publisher = await _publisher(via_proxy(amqp_url, proxy.port), kind)
    try:
        assert len((await publisher.publish(_messages(exchange, "rk", 5))).confirmed) == 5
        proxy.hold_replies = True
        sent_before = proxy.bytes_up
        batch = _messages(exchange, "rk", 500)
        task = asyncio.ensure_future(publisher.publish(batch))
        await wait_until(lambda: proxy.bytes_up - sent_before > 500 * 100, what="batch written")
        await proxy.reset()
        result = await asyncio.wait_for(task, timeout=30)
        assert result.confirmed == []
        assert sorted(result.unsent) == sorted(m.id for m in batch)
        assert set(result.unsent.values()) == {Reason.BROKER_LOST}
        await wait_until(lambda: not publisher.ready, timeout_s=10, what="outage noticed")
        await asyncio.wait_for(publisher.wait_ready(), timeout=30)
        assert len((await publisher.publish(_messages(exchange, "rk", 5))).confirmed) == 5
    finally:
        await publisher.close()
        await proxy.close()


async def test_publish__a_silent_broker_leaves_rows_untouched_and_reconnects(
    amqp_url: str, broker_names: tuple[str, str]
) -> None:
    """A network cut that drops packets looks like a broker that stops answering: no confirm
    comes back. Not the rows' fault: untouched, no attempt counted, and a new connection."""
    exchange, _ = broker_names
    proxy = await proxy_for(amqp_url)
    publisher = await _publisher(via_proxy(amqp_url, proxy.port), BulkPublisher,
                                 timeout_s=2)
    try:
        assert len((await publisher.publish(_messages(exchange, "rk", 5))).confirmed) == 5
        opened = publisher.connection.opened
        proxy.hold_replies = True
        batch = _messages(exchange, "rk", 50)
        result = await asyncio.wait_for(publisher.publish(batch), timeout=30)
        assert not result.failed, "an outage counted attempts against rows"
        assert sorted(result.unsent) == sorted(m.id for m in batch)
        assert set(result.unsent.values()) == {Reason.BROKER_LOST}
        proxy.hold_replies = False
        await asyncio.wait_for(publisher.wait_ready(), timeout=30)
        assert publisher.connection.opened == opened + 1
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
    assert sorted(consumer.ids) == sorted(good)
    assert await count_rows(env.pg_dsn) == 1
    assert relay.terminate() == 0


async def _rows_left_are(dsn: str, ids: list[str]) -> bool:
    rows = await pg_fetch(dsn, "SELECT id::text, attempts, last_error FROM queue_message")
    return (sorted(r["id"] for r in rows) == sorted(ids)
            and all(r["attempts"] == 1 and r["last_error"].startswith("unroutable") for r in rows))
