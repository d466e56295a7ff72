"""Bulk publisher without a broker: connection.blocked holds writes back; tags settle rows."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from relay.amqp.bulk import BulkPublisher, _ConfirmChannel
from relay.amqp.frames import ACKED, NACKED, ConfirmTracker, FrameEncoder
from relay.amqp.publisher import amqp_properties
from relay.interfaces import Message, PublishResult
from relay.options import Properties


def _fakes(timeout_s: float) -> tuple[BulkPublisher, _ConfirmChannel, asyncio.Event]:
    unblocked = asyncio.Event()
    aiormq_conn = SimpleNamespace(_Connection__connection_unblocked=unblocked)
    pub = BulkPublisher("amqp://x/", publish_timeout_s=timeout_s, reconnect_max_s=1)
    connected = asyncio.Event()
    connected.set()
    pub._connection = SimpleNamespace(
        is_closed=False, connected=connected, transport=SimpleNamespace(connection=aiormq_conn)
    )
    raw = SimpleNamespace(is_closed=False, write_queue=asyncio.Queue())
    channel = _ConfirmChannel(raw, ConfirmTracker(), FrameEncoder(1, 131072, amqp_properties),
                              asyncio.Lock())
    return pub, channel, unblocked


def _messages(n: int) -> list[Message]:
    return [Message(f"id-{i}", "x", "rk", b"{}", Properties(), True) for i in range(n)]


async def test_send__while_blocked_writes_nothing_and_leaves_the_batch_unsent() -> None:
    pub, channel, _ = _fakes(timeout_s=0.2)
    assert not pub.ready
    lost = await pub._send(channel, _messages(3), PublishResult())
    assert [m.id for m in lost] == ["id-0", "id-1", "id-2"]
    assert channel.raw.write_queue.empty()
    assert channel.tracker.next_tag == 1


async def test_send__after_unblock_writes_once_and_settles_from_acks_and_nacks() -> None:
    pub, channel, unblocked = _fakes(timeout_s=5)
    result = PublishResult()
    task = asyncio.ensure_future(pub._send(channel, _messages(4), result))
    await asyncio.sleep(0.05)
    assert channel.raw.write_queue.empty()  # still blocked
    unblocked.set()
    frame = await asyncio.wait_for(channel.raw.write_queue.get(), timeout=5)
    assert frame.payload.count(b"\xce") == 12  # method, header, body per message, one write
    channel.tracker.on_return("id-1", "unroutable: test")
    channel.tracker.on_confirm(2, True, ACKED)
    channel.tracker.on_confirm(3, False, NACKED)
    channel.tracker.on_confirm(4, False, ACKED)
    assert await asyncio.wait_for(task, timeout=5) == []
    assert result.confirmed == ["id-0", "id-3"]
    assert result.failed == {"id-1": "unroutable: test", "id-2": "nacked by the broker"}


async def test_send__confirm_timeout_fails_the_unconfirmed_rows_only() -> None:
    pub, channel, unblocked = _fakes(timeout_s=0.3)
    unblocked.set()
    result = PublishResult()
    task = asyncio.ensure_future(pub._send(channel, _messages(2), result))
    await channel.raw.write_queue.get()
    channel.tracker.on_confirm(1, False, ACKED)
    assert await task == []
    assert result.confirmed == ["id-0"]
    assert result.failed == {"id-1": "confirm timeout after 0.3s"}
    assert not channel.tracker.ranges


async def test_send__confirms_held_by_a_blocked_broker_leave_rows_unsent_not_failed() -> None:
    pub, channel, unblocked = _fakes(timeout_s=0.3)
    unblocked.set()
    result = PublishResult()
    task = asyncio.ensure_future(pub._send(channel, _messages(2), result))
    await channel.raw.write_queue.get()
    channel.tracker.on_confirm(1, False, ACKED)
    unblocked.clear()  # connection.blocked arrives while the confirms are outstanding
    assert await task == []
    assert result.confirmed == ["id-0"]
    assert result.unsent == ["id-1"]
    assert not result.failed
