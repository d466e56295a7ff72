"""The bulk publish path: a whole batch as one write, settled from the broker's acks by tag.

aio-pika and aiormq keep owning the connection, the channel lifecycle, heartbeats and flow
control state. This publisher only (1) writes pre-encoded frames (relay/amqp/frames.py) to the
connection's write queue, and (2) replaces, on its own dedicated confirm channel, the two
aiormq hooks that would otherwise cost a future per message: `_on_confirm_frame` (acks and
nacks, usually `multiple`) and `_on_return_frame` (basic.return, tied to its row by
message_id or the x-outbox-id header). Nothing else publishes on that channel, so the
delivery tags the broker assigns are exactly the ones counted here.

Guarantees kept: only an ack for a message that was not returned counts as confirmed; a nack
or a return is a failure of that row only; a channel close (404 on an exchange deleted since
the check) leaves every unconfirmed message unsent and the batch is sent again on a new
channel after a fresh exchange check; a lost connection leaves them unsent; a confirm that
does not come within the timeout is a failure (retried later).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiormq.abc import ChannelFrame
from aiormq.exceptions import ChannelInvalidStateError
from pamqp import commands as spec

from relay.amqp.frames import ACKED, NACKED, ConfirmTracker, FrameEncoder, TagRange
from relay.amqp.publisher import _BROKER_LOST, OUTBOX_ID_HEADER, AmqpPublisher, amqp_properties
from relay.interfaces import Message, PublishResult

log = structlog.get_logger("relay.amqp.bulk")

_PASSES = 3


@dataclass(eq=False, slots=True)
class _ConfirmChannel:
    """One opened confirm channel with its tag tracker and encoder."""

    raw: Any  # aiormq.Channel
    tracker: ConfirmTracker
    encoder: FrameEncoder
    write_lock: asyncio.Lock

    @property
    def closed(self) -> bool:
        return bool(self.raw.is_closed)


def _returned_row_id(properties: spec.Basic.Properties) -> str | None:
    headers = properties.headers or {}
    value = headers.get(OUTBOX_ID_HEADER, properties.message_id)
    return None if value is None else str(value)


def _hook(raw: Any, tracker: ConfirmTracker) -> None:
    """Route the channel's confirms and returns to the tracker instead of per-message futures.

    The channel's reader task calls these in frame order, so a basic.return is always seen
    before the ack of the same message.
    """

    async def on_confirm(frame: spec.Basic.Ack | spec.Basic.Nack) -> None:
        code = ACKED if isinstance(frame, spec.Basic.Ack) else NACKED
        tracker.on_confirm(frame.delivery_tag, bool(frame.multiple), code)

    async def on_return(frame: spec.Basic.Return) -> None:
        header = await raw._get_frame()
        remaining = header.body_size
        while remaining > 0:
            remaining -= len((await raw._get_frame()).value)
        row_id = _returned_row_id(header.properties)
        if row_id is None:
            log.warning("return_without_id", exchange=frame.exchange, key=frame.routing_key)
            return
        tracker.on_return(
            row_id,
            f"unroutable: returned by the broker ({frame.reply_code} {frame.reply_text}; "
            f"exchange {frame.exchange!r}, key {frame.routing_key!r})",
        )

    raw._on_confirm_frame = on_confirm
    raw._on_return_frame = on_return
    raw.closing.add_done_callback(lambda _: tracker.abandon_all())


class BulkPublisher(AmqpPublisher):
    """Publishes each batch as one socket write and settles it from (multiple) acks.

    Several batches (one per worker lane) may be in flight on the channel at once; each owns
    a contiguous range of delivery tags.
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._confirm: _ConfirmChannel | None = None

    async def _open_channels(self) -> None:
        await super()._open_channels()
        raw = await self._channel.get_underlay_channel()
        tracker = ConfirmTracker()
        _hook(raw, tracker)
        frame_max = int(raw.connection.connection_tune.frame_max or 131072)
        encoder = FrameEncoder(raw.number, frame_max, amqp_properties)
        self._confirm = _ConfirmChannel(raw, tracker, encoder, asyncio.Lock())

    async def _usable_channel(self) -> _ConfirmChannel | None:
        """The confirm channel, reopened when a close took it away (connection still up)."""
        current = self._confirm
        side_open = self._side is not None and not self._side.is_closed
        if current is not None and not current.closed and self._channel is not None and side_open:
            return current
        if not self.connected:
            return None
        try:
            await self._open_channels()
        except (*_BROKER_LOST, ChannelInvalidStateError, RuntimeError):
            # aio-pika raises RuntimeError for a channel on a connection that just closed.
            return None
        return self._confirm

    async def publish(self, messages: Sequence[Message]) -> PublishResult:
        """Publish a batch; settle every message as confirmed, failed or unsent.

        After the broker closes the channel under a batch (a row it refuses at the protocol
        level), the unconfirmed rest is sent again one message per write on a fresh channel,
        so that only the offending row fails and the others are delivered.
        """
        result = PublishResult()
        pending = self._refuse_foreign_user_ids(messages, result)
        isolate = False
        for _ in range(_PASSES):
            if not pending or not self.connected:
                break
            async with self._lock:
                channel = await self._usable_channel()
                if channel is None:
                    break
                try:
                    missing = await self._missing_exchanges({m.exchange for m in pending})
                except (*_BROKER_LOST, ChannelInvalidStateError):
                    # The connection is going down under us (its channels close first).
                    break
            sendable = []
            for m in pending:
                if m.exchange in missing:
                    result.failed[m.id] = f"exchange {m.exchange!r} not found"
                else:
                    sendable.append(m)
            if isolate:
                pending = await self._send_isolated(sendable, result)
            else:
                pending = await self._send(channel, sendable, result)
            if pending:
                # The channel closed under the batch: everything unconfirmed on it is sent
                # again after a fresh exchange check, one message per write.
                self.exchanges.forget()
                isolate = self.connected and not self.blocked
        if pending:
            result.unsent.extend(m.id for m in pending)
            result.broker_lost = not self.connected
        if result.unsent:
            # Unsent rows are published again later: say so, since each is a possible duplicate.
            log.warning("batch_unsent", count=len(result.unsent), connected=self.connected,
                        blocked=self.blocked)
        return result

    async def _send_isolated(
        self, messages: list[Message], result: PublishResult
    ) -> list[Message]:
        """One message per write; a message whose write closes the channel alone fails."""
        for index, m in enumerate(messages):
            async with self._lock:
                channel = await self._usable_channel()
            if channel is None:
                return messages[index:]
            lost = await self._send(channel, [m], result)
            if not lost:
                continue
            if not self.connected or self.blocked:
                return messages[index:]
            result.failed[m.id] = (
                "channel closed by the broker when this message was published "
                f"(exchange {m.exchange!r}, key {m.routing_key!r})"
            )
        return []

    async def _wait_unblocked(self, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while self.connected and self.blocked:
            event = self._unblocked_event()
            left = deadline - loop.time()
            if event is None or left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=min(left, 1.0))
        return self.connected and not self.blocked

    async def _send(
        self, channel: _ConfirmChannel, messages: list[Message], result: PublishResult
    ) -> list[Message]:
        """One write of the batch; returns the messages whose fate is unknown."""
        if not messages:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.publish_timeout_s
        payload = channel.encoder.encode(messages)
        # connection.blocked: the broker stops reading; do not add to what it cannot take.
        if not await self._wait_unblocked(deadline):
            return messages
        done = loop.create_future()

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        async with channel.write_lock:
            if channel.closed:
                return messages
            tags = channel.tracker.add([m.id for m in messages], finished)
            drain = loop.create_future()
            try:
                await channel.raw.write_queue.put(ChannelFrame(payload, False, drain))
            except BaseException:
                # Not written: give the tags back so the next batch's numbering stays exact.
                channel.tracker.next_tag = tags.first
                channel.tracker.discard(tags)
                drain.cancel()
                raise
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout=max(deadline - loop.time(), 0))
        except TimeoutError:
            timed_out = True
        finally:
            if not done.done():
                # Timed out or cancelled: confirms that still come for these tags are ignored.
                channel.tracker.discard(tags)
            if not drain.done():
                drain.cancel()
        return self._settle(channel, messages, tags, timed_out, result)

    def _settle(
        self,
        channel: _ConfirmChannel,
        messages: list[Message],
        tags: TagRange,
        timed_out: bool,
        result: PublishResult,
    ) -> list[Message]:
        returned = channel.tracker.returned
        lost: list[Message] = []
        if not timed_out and tags.remaining:
            log.warning("batch_abandoned", unconfirmed=tags.remaining,
                        channel_closed=channel.closed)
        for m, code in zip(messages, tags.status, strict=True):
            reason = returned.pop(m.id, None) if returned else None
            if code == ACKED:
                if reason is None:
                    result.confirmed.append(m.id)
                else:
                    result.failed[m.id] = reason
            elif code == NACKED:
                result.failed[m.id] = "nacked by the broker"
            elif timed_out and self.blocked:
                # The broker stopped reading (connection.blocked) and holds the confirms:
                # not the row's fault, so no attempt is counted; the worker waits for unblock.
                result.unsent.append(m.id)
            elif timed_out and not channel.closed:
                result.failed[m.id] = f"confirm timeout after {self.publish_timeout_s:g}s"
            else:
                lost.append(m)
        return lost
