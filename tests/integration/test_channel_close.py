"""A channel the broker closes while a pass is being written: writing stops at the broker's
channel.close, before aiormq's close-ok, so no frame reaches the channel number the broker has
closed (RabbitMQ answers such a frame with 504 CHANNEL_ERROR and closes the whole connection,
taking every other lane's channel with it)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aio_pika

from relay.amqp import compat
from relay.amqp.frames import Confirm
from relay.amqp.transports import Bulk
from relay.interfaces import Message
from relay.options import Properties

BODY = 512 * 1024  # two messages to a write (frames.CHUNK_BYTES) ...
MESSAGES = 80  # ... so as about 40 writes, most of them after the broker's close


def _is_close_ok(payload: bytes, number: int) -> bool:
    """An AMQP method frame channel.close-ok (class 20, method 41) for channel `number`."""
    return (payload[:1] == b"\x01" and int.from_bytes(payload[1:3], "big") == number
            and payload[7:11] == b"\x00\x14\x00\x29")


class _WriteOrder:
    """Watches the connection's write queue: what was queued for one channel, in order.

    When aiormq queues the close-ok, the last write of the pass is marked written at once (as
    a fast socket would), so the pass resumes within the loop turns before aiormq marks the
    channel closed: the window the broker's 504 came through.
    """

    def __init__(self, queue: asyncio.Queue[Any], number: int) -> None:
        self.number = number
        self.after_close_ok = 0
        self.writes = 0
        self.writes_at_close_ok: int | None = None
        self._last: Any = None
        original = queue.put_nowait

        def put_nowait(item: Any) -> None:
            payload = bytes(item.payload)
            if _is_close_ok(payload, number):
                self.writes_at_close_ok = self.writes
                if self._last is not None:
                    self._last.drain()
            elif int.from_bytes(payload[1:3], "big") == number:
                self.writes += 1
                self._last = item
                if self.writes_at_close_ok is not None:
                    self.after_close_ok += 1
            original(item)

        queue.put_nowait = put_nowait  # type: ignore[method-assign]


async def test_broker_closes_the_channel_mid_pass__no_frame_after_the_close_ok_connection_kept(
    amqp_url: str,
) -> None:
    conn = await aio_pika.connect(amqp_url)
    try:
        bulk = Bulk()
        await bulk.open(conn)
        confirm = bulk._confirm
        assert confirm is not None
        order = _WriteOrder(confirm.raw.write_queue, confirm.raw.number)
        missing = f"relay-test-missing-{uuid.uuid4()}"  # the first publish closes the channel
        messages = [Message(str(uuid.uuid4()), missing, "rk", b"x" * BODY, Properties(), False)
                    for _ in range(MESSAGES)]
        loop = asyncio.get_running_loop()
        closes_before = compat.HOOK_CALLS.closes
        sent = await bulk.send(messages, loop.time() + 15)
        # The installed aiormq calls the wrapped channel.close reader (compat.py's contract).
        assert compat.HOOK_CALLS.closes == closes_before + 1
        assert order.writes_at_close_ok is not None, "the broker never closed the channel"
        assert order.writes_at_close_ok < MESSAGES // 2, (
            "the pass was written whole before the close: nothing was tested")
        assert order.after_close_ok == 0, (
            f"{order.after_close_ok} writes queued for channel {order.number} after its close-ok")
        # What went out before the close is lost (its fate unknown), the rest was never sent.
        assert set(sent.status) == {Confirm.LOST, Confirm.NOT_SENT}
        assert sent.closed_by_broker is not None
        assert "NOT_FOUND" in sent.closed_by_broker
        # The broker kept the connection: a new channel opens and answers on it.
        await asyncio.sleep(0.5)
        assert not compat.underlay_closed(conn), "the broker closed the connection"
        channel = await asyncio.wait_for(conn.channel(), timeout=5)
        await asyncio.wait_for(channel.get_exchange("amq.direct", ensure=True), timeout=5)
    finally:
        await conn.close()
