"""The two ways a pass of messages reaches the broker, behind one seam (`Transport.send`).

- `PerMessage`: one aiormq basic_publish (and future) per message, on an aio-pika confirm
  channel; acks and nacks come back through aiormq's own futures (by delivery tag).
- `Bulk`: the whole pass encoded as frames (relay/amqp/frames.py) and written at once; acks and
  nacks, usually `multiple`, settle contiguous delivery-tag ranges.

Both tie a basic.return to its row by the relay's own header only (relay/amqp/compat.py routes
the channel's return frames here), and both report, per message: acked, nacked, timed out, or
lost (the channel or connection closed before a confirm). Deciding what each means for the row
is the pipeline's business (relay/amqp/pipeline.py), the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from pamqp import commands as spec

from relay.amqp import compat
from relay.amqp.encoder import amqp_properties, publish_method, returned_row_id
from relay.amqp.frames import CHUNK_BYTES, HEARD, Confirm, ConfirmTracker, FrameEncoder, TagRange
from relay.amqp.pacing import LinkMeter
from relay.interfaces import Message

log = structlog.get_logger("relay.amqp.transports")



@dataclass(slots=True)
class Sent:
    """What the broker said about each message of one pass, in order."""

    status: list[int]  # a frames.Confirm per message (never PENDING)
    returned: dict[str, str] = field(default_factory=dict)  # row id -> why it came back
    closed_by_broker: str | None = None  # the broker closed the channel: its reason
    waited_s: float = 0.0  # how long the pass waited for confirms
    # The broker confirmed messages of other passes on the channel while this one waited: it
    # is alive, and this pass's confirms are behind them (a slow link), not lost.
    others_heard: bool = False

    @property
    def heard(self) -> bool:
        """The broker confirmed at least one message of the pass (it is alive)."""
        return any(s in HEARD for s in self.status)


class Transport(Protocol):
    """Sends one pass of messages on the relay's confirm channel."""

    @property
    def usable(self) -> bool:
        """The confirm channel is open."""

    async def open(self, connection: Any) -> None:
        """Open (or reopen) the confirm channel on an aio-pika connection."""

    async def discard(self) -> None:
        """Close the channel (bounded, errors ignored): a message it still waits for would
        hold back the confirms of every later one on it. The next send opens another."""

    async def send(self, messages: Sequence[Message], deadline: float) -> Sent:
        """Publish and wait for confirms until `deadline` (loop time)."""


# Returns kept for rows whose pass has not read them yet; a return for a pass that already
# ended (its deadline passed) is never read, so the oldest go first beyond this many.
RETURNS_KEPT = 100_000
CLOSE_TIMEOUT_S = 2.0


async def _close_quietly(raw: Any) -> None:
    """Close a raw channel within CLOSE_TIMEOUT_S, whatever the broker or the link does."""
    if raw is None or raw.is_closed:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(raw.close(), timeout=CLOSE_TIMEOUT_S)


class _Returns:
    """basic.return frames of one channel, by row id (the relay's header)."""

    def __init__(self, kept: int = RETURNS_KEPT) -> None:
        self.by_row: dict[str, str] = {}
        self.kept = kept

    def __call__(self, frame: spec.Basic.Return, properties: spec.Basic.Properties) -> None:
        row_id = returned_row_id(properties)
        if row_id is None:
            log.warning("return_without_id", exchange=frame.exchange, key=frame.routing_key)
            return
        self.by_row[row_id] = (
            f"returned by the broker ({frame.reply_code} {frame.reply_text}; "
            f"exchange {frame.exchange!r}, key {frame.routing_key!r})"
        )
        if len(self.by_row) > self.kept:
            del self.by_row[next(iter(self.by_row))]  # the oldest: dicts keep insertion order

    def take(self, ids: Sequence[str]) -> dict[str, str]:
        """Remove and return the returns of these rows."""
        out = {}
        for row_id in ids:
            reason = self.by_row.pop(row_id, None)
            if reason is not None:
                out[row_id] = reason
        return out


async def _confirm_channel(connection: Any) -> tuple[Any, Any, _Returns]:
    """A new confirm channel (aio-pika and aiormq objects), checked, its returns hooked."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=False)
    raw = await channel.get_underlay_channel()
    compat.verify(connection, raw)
    returns = _Returns()
    compat.hook_returns(raw, returns)
    return channel, raw, returns


class _Closing:
    """Whether a channel is closing, and why the broker closed it (a channel.close it sent).

    `ended` turns true as the broker's channel.close is read (before aiormq queues its
    close-ok, compat.hook_broker_close) or as the relay starts closing the channel itself:
    nothing is written for the channel from then on. aiormq's own `is_closed` turns true a few
    loop turns later; a frame written in between would follow the close-ok onto a closed
    channel number, and the broker closes the whole connection for that (504).
    """

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.reason: str | None = None
        self.ended = False
        compat.hook_broker_close(raw, self._broker_closed)
        compat.on_close(raw, self._closed)

    @property
    def closed(self) -> bool:
        """Nothing more may be written on the channel."""
        return self.ended or bool(self.raw.is_closed)

    def _broker_closed(self, reason: str) -> None:
        self.ended = True
        self.reason = self.reason or reason

    def _closed(self, exc: BaseException | None) -> None:
        self.ended = True
        if isinstance(exc, compat.CHANNEL_CLOSED) and self.reason is None:
            self.reason = str(exc) or type(exc).__name__

    async def close(self) -> None:
        """Close the channel from the relay's side (bounded, errors ignored)."""
        self.ended = True
        await _close_quietly(self.raw)


class PerMessage:
    """One basic_publish per message through aiormq; see the module docstring."""

    def __init__(self) -> None:
        self._channel: Any = None  # aio-pika channel
        self._raw: Any = None  # its aiormq channel
        self._returns = _Returns()
        self._closing: _Closing | None = None

    @property
    def usable(self) -> bool:
        """The confirm channel is open."""
        return self._raw is not None and self._closing is not None and not self._closing.closed

    async def open(self, connection: Any) -> None:
        """Open a confirm channel and route its returns to the relay's header."""
        self._channel, self._raw, self._returns = await _confirm_channel(connection)
        self._closing = _Closing(self._raw)

    async def discard(self) -> None:
        """Close the channel; the next open() brings another (Transport.discard)."""
        closing, self._raw, self._closing = self._closing, None, None
        if closing is not None:
            await closing.close()

    async def send(self, messages: Sequence[Message], deadline: float) -> Sent:
        """Publish every message; wait for their confirms until the deadline."""
        # This channel's own returns: a reopen meanwhile brings a new channel with its own.
        raw, returns, closing = self._raw, self._returns, self._closing
        loop = asyncio.get_running_loop()
        tasks = [
            asyncio.ensure_future(
                raw.basic_publish(m.body, exchange=m.exchange, routing_key=m.routing_key,
                                  properties=amqp_properties(m), mandatory=m.mandatory)
            )
            for m in messages
        ]
        started = loop.time()
        _, not_done = await asyncio.wait(tasks, timeout=max(deadline - loop.time(), 0.0))
        for task in not_done:
            task.cancel()
        if not_done:
            await asyncio.gather(*not_done, return_exceptions=True)
        status = [self._status(task, task in not_done) for task in tasks]
        closed = next((str(e) for t in tasks if (e := _exception(t)) is not None
                       and isinstance(e, compat.CHANNEL_CLOSED)), None)
        if closed is None and closing is not None and closing.closed:
            closed = closing.reason
        return Sent(status, returns.take([m.id for m in messages]), closed,
                    loop.time() - started)

    @staticmethod
    def _status(task: asyncio.Future[Any], timed_out: bool) -> int:
        if timed_out:
            return Confirm.TIMEOUT
        if task.cancelled():
            return Confirm.LOST
        exc = task.exception()
        if exc is None:
            return Confirm.ACKED if isinstance(task.result(), spec.Basic.Ack) else Confirm.LOST
        if isinstance(exc, compat.DELIVERY_ERROR):
            return Confirm.NACKED
        return Confirm.LOST


class _PartlyWritten(Exception):
    """The writer stopped taking pieces inside a message split over several of them."""


async def _paced(meter: LinkMeter, size: int, deadline: float, *, first: bool,
                 closed: Callable[[], bool] = lambda: False) -> bool:
    """Wait until `size` more bytes in flight can be confirmed by the deadline; False when
    they cannot be (the pass writes nothing more). A pass's first piece goes once nothing is
    in flight, so a link slower than one piece per budget still moves; so does every piece
    before the link is measured."""
    loop = asyncio.get_running_loop()
    while (left := deadline - loop.time()) > 0:
        if closed():
            return False  # the channel (or its connection) is gone: nothing more is written
        in_flight = meter.in_flight
        if in_flight == 0 and (first or meter.rate is None):
            return True
        if in_flight + size <= meter.allowance(left):
            return True
        if in_flight == 0:
            return False  # not even on an idle link
        await meter.wait_heard(left)
    return False


def _exception(task: asyncio.Future[Any]) -> BaseException | None:
    return None if task.cancelled() else task.exception()


@dataclass(eq=False, slots=True)
class _ConfirmChannel:
    """One opened confirm channel with its tag tracker and encoder."""

    raw: Any  # aiormq.Channel
    tracker: ConfirmTracker
    encoder: FrameEncoder
    write_lock: asyncio.Lock
    closing: _Closing
    # The basic.return frames that came on this channel: a pass reads its returns here, never
    # on a channel opened since (the returned row would be taken as published).
    returns: _Returns = field(default_factory=_Returns)

    @property
    def closed(self) -> bool:
        """Nothing more may be written on the channel (_Closing.closed)."""
        return self.closing.closed


class Bulk:
    """A pass as one write of pre-encoded frames, settled from (multiple) acks by tag.

    Several passes (one per worker lane) may be in flight on the channel at once; each owns a
    contiguous range of delivery tags. Nothing else publishes on this channel, so the tags the
    broker assigns are exactly the ones counted here.
    """

    def __init__(self) -> None:
        self._confirm: _ConfirmChannel | None = None
        # Kept across channels: the link's rate outlives a channel (relay/amqp/pacing.py).
        self.meter = LinkMeter()

    @property
    def usable(self) -> bool:
        """The confirm channel is open."""
        return self._confirm is not None and not self._confirm.closed

    async def discard(self) -> None:
        """Close the channel; the next open() brings another (Transport.discard)."""
        confirm, self._confirm = self._confirm, None
        if confirm is not None:
            await confirm.closing.close()

    async def open(self, connection: Any) -> None:
        """Open a confirm channel whose confirms and returns go to the tag tracker."""
        _, raw, returns = await _confirm_channel(connection)
        tracker = ConfirmTracker()
        meter = self.meter
        meter.new_channel()

        def on_confirm(frame: spec.Basic.Ack | spec.Basic.Nack) -> None:
            code = Confirm.ACKED if isinstance(frame, spec.Basic.Ack) else Confirm.NACKED
            tracker.heard_at = asyncio.get_running_loop().time()
            meter.heard(frame.delivery_tag, tracker.heard_at)
            tracker.on_confirm(frame.delivery_tag, bool(frame.multiple), code)

        compat.hook_confirms(raw, on_confirm)
        def on_close(_: BaseException | None) -> None:
            tracker.abandon_all()
            meter.wake()  # a pass waiting to write more stops now, not at its deadline

        compat.on_close(raw, on_close)
        encoder = FrameEncoder(raw.number, compat.frame_max(raw), amqp_properties, publish_method)
        self._confirm = _ConfirmChannel(raw, tracker, encoder, asyncio.Lock(), _Closing(raw),
                                        returns)

    async def send(self, messages: Sequence[Message], deadline: float) -> Sent:
        """One write of the pass; wait for its confirms until the deadline."""
        channel = self._confirm
        assert channel is not None
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        try:
            # Other lanes' passes write on this channel one at a time: a pass that cannot
            # start writing by its deadline sends nothing.
            await asyncio.wait_for(channel.write_lock.acquire(),
                                   timeout=max(deadline - loop.time(), 0))
        except TimeoutError:
            return Sent([Confirm.NOT_SENT] * len(messages))
        try:
            if channel.closed:
                return Sent([Confirm.LOST] * len(messages))
            tags = channel.tracker.add([m.id for m in messages], finished)
            try:
                drain, written = await self._write(channel, messages, tags.first, deadline)
            except BaseException as exc:
                if isinstance(exc, _PartlyWritten):
                    # The deadline came inside a message larger than a write: a message cut
                    # in two cannot be taken back, so the channel closes (what the broker
                    # confirmed before stays confirmed) and the pipeline reopens it.
                    await channel.closing.close()
                    channel.tracker.discard(tags)
                    return self._settle(channel, messages, tags, False, 0.0)
                # Not written: give the tags back so the next pass's numbering stays exact.
                channel.tracker.next_tag = tags.first
                channel.tracker.discard(tags)
                if isinstance(exc, TimeoutError):  # the writer is stuck (blocked, or a dead
                    return Sent([Confirm.NOT_SENT] * len(messages))  # socket): nothing went out
                raise
            if written < len(messages):
                # The deadline came between two writes: what went out keeps its tags and its
                # confirms (the channel stays open for the other lanes); the rest is not sent.
                channel.tracker.trim(tags, written)
        finally:
            channel.write_lock.release()
        timed_out, started = False, loop.time()
        heard_before = channel.tracker.heard_at
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
        sent = self._settle(channel, messages, tags, timed_out, loop.time() - started)
        sent.others_heard = channel.tracker.heard_at > heard_before
        return sent

    async def _write(self, channel: _ConfirmChannel, messages: Sequence[Message],
                     first_tag: int, deadline: float) -> tuple[asyncio.Future[None], int]:
        """Hand the batch to the connection's writer piece by piece, each piece drained to
        the socket before the next is encoded, and, between messages, only while the broker
        can confirm it by the deadline (relay/amqp/pacing.py); return the last piece's drain
        future and how many messages were handed over whole (a slow link: the rest waits for
        a later batch). TimeoutError: not even the first piece was taken; _PartlyWritten: the
        deadline came inside a message split over several pieces."""
        loop = asyncio.get_running_loop()
        meter = self.meter
        drain: asyncio.Future[None] | None = None
        written, whole = 0, True
        for chunk in channel.encoder.encode_chunks(messages, meter.piece_bytes(CHUNK_BYTES)):
            if whole and not await _paced(meter, len(chunk.payload), deadline,
                                          first=drain is None, closed=lambda: channel.closed):
                return drain or loop.create_future(), written
            try:
                if drain is not None:
                    await asyncio.wait_for(asyncio.shield(drain),
                                           max(deadline - loop.time(), 0))
                # Closed under the pass (checked as the frames are queued): its number may be
                # reopened for another channel, and frames for a closed number close the
                # whole connection (504).
                taken = await compat.write(channel.raw, chunk.payload, deadline - loop.time(),
                                           lambda: channel.closed)
                if taken is None:
                    return drain or loop.create_future(), written
            except TimeoutError:
                if drain is None:
                    raise
                if not whole:
                    raise _PartlyWritten from None
                return drain, written
            meter.wrote(first_tag + written + max(chunk.ended, 1) - 1, len(chunk.payload),
                        loop.time())
            drain, written, whole = taken, written + chunk.ended, chunk.whole
        assert drain is not None
        return drain, written

    def _settle(self, channel: _ConfirmChannel, messages: Sequence[Message], tags: TagRange,
                timed_out: bool, waited_s: float) -> Sent:
        # Once for the pass, not per message: what a message with no confirm became.
        unconfirmed = Confirm.TIMEOUT if timed_out and not channel.closed else Confirm.LOST
        pending = Confirm.PENDING
        status = [unconfirmed if code == pending else code for code in tags.status]
        return Sent(status, channel.returns.take([m.id for m in messages]),
                    channel.closing.reason if channel.closed else None, waited_s)
