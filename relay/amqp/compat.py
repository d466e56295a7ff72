"""Every use of aiormq and aio-pika internals, in one place, checked when a connection opens.

The relay leans on five things the libraries do not document: aiormq's connection.blocked event
(read, never set), a channel's frame reader hooks for basic.ack/nack and basic.return (replaced on
the relay's own confirm channels) and for channel.close (wrapped: the broker's close is known
before aiormq queues its close-ok), the channel's frame queue (to read a returned message's header
and body) and the connection's write queue (to write a batch of pre-encoded frames). `verify`
runs at every connect and fails with the library versions and what is missing, instead of a
publish that silently settles nothing. pyproject.toml pins both libraries to tested ranges;
tests/integration/test_compat.py fails if a replaced hook stops being called.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame
from aiormq.channel import exception_by_code as channel_exception_by_code
from pamqp import commands as spec
from pamqp import common as pamqp_common
from pamqp import encode as pamqp_encode

from relay.errors import BrokerError

ConfirmHook = Callable[[spec.Basic.Ack | spec.Basic.Nack], None]
ReturnHook = Callable[[spec.Basic.Return, spec.Basic.Properties], None]

_UNBLOCKED = "_Connection__connection_unblocked"
_CHANNEL_NEEDS = ("_on_confirm_frame", "_on_return_frame", "_on_close_frame", "_get_frame",
                  "write_queue", "number", "closing", "is_closed", "connection")


@dataclass(slots=True)
class HookCalls:
    """How often the replaced hooks ran (read by the contract test and by nobody else)."""

    confirms: int = 0
    returns: int = 0
    closes: int = 0


HOOK_CALLS = HookCalls()


_encode_table_value = pamqp_encode.encode_table_value


def _table_value(value: Any) -> bytes:
    """pamqp's table value encoding, except that a float is a double ('d'): pamqp writes a
    32-bit float ('f'), so 12345678.9 would reach the consumer as 12345679.0."""
    if isinstance(value, float):
        return b"d" + pamqp_common.Struct.double.pack(value)
    return bytes(_encode_table_value(value))


def encode_floats_as_doubles() -> None:
    """Make pamqp (and so aiormq and the frame encoder) write header floats as doubles.

    pamqp's field_table and field_array look the value encoder up as a module global at every
    call, so replacing it there reaches every table pamqp writes in this process.
    """
    pamqp_encode.encode_table_value = _table_value


encode_floats_as_doubles()


def versions() -> str:
    """The installed library versions, for error messages."""
    return ", ".join(f"{name} {version(name)}" for name in ("aio-pika", "aiormq", "pamqp"))


def underlay(connection: Any) -> Any:
    """The aiormq connection under an aio-pika connection, or None once it is gone."""
    return getattr(getattr(connection, "transport", None), "connection", None)


def verify(connection: Any, raw_channel: Any) -> None:
    """Raise BrokerError (not retried: upgrade or pin the libraries) when an internal is gone."""
    missing = [f"aiormq.Channel.{name}" for name in _CHANNEL_NEEDS
               if not hasattr(raw_channel, name)]
    conn = underlay(connection)
    if conn is None:
        missing.append("aio_pika.Connection.transport.connection")
    else:
        if not isinstance(getattr(conn, _UNBLOCKED, None), asyncio.Event):
            missing.append("aiormq.Connection.__connection_unblocked")
        if not isinstance(getattr(conn, "write_queue", None), asyncio.Queue):
            missing.append("aiormq.Connection.write_queue")
        if getattr(getattr(conn, "connection_tune", None), "frame_max", None) is None:
            missing.append("aiormq.Connection.connection_tune.frame_max")
    if missing:
        raise BrokerError(f"the installed broker libraries ({versions()}) lack what the relay "
                          f"uses: {', '.join(missing)}; install the versions in constraints.txt")


def unblocked_event(connection: Any) -> asyncio.Event | None:
    """aiormq's private connection.blocked state: set while the broker accepts publishes."""
    event = getattr(underlay(connection), _UNBLOCKED, None)
    return event if isinstance(event, asyncio.Event) else None


def underlay_closed(connection: Any) -> bool:
    """aio-pika >= 10 marks `is_closed` only on an explicit close(): ask aiormq too."""
    conn = underlay(connection)
    return conn is None or bool(getattr(conn, "is_closed", True))


def frame_max(raw_channel: Any) -> int:
    """The frame size negotiated for the channel's connection."""
    return int(raw_channel.connection.connection_tune.frame_max or 131072)


def connection_frame_max(connection: Any) -> int | None:
    """The frame size negotiated on an aio-pika connection (None before the tune)."""
    tune = getattr(underlay(connection), "connection_tune", None)
    value = getattr(tune, "frame_max", None)
    return int(value) if value else None


def hook_confirms(raw_channel: Any, on_confirm: ConfirmHook) -> None:
    """Route the channel's basic.ack/nack frames to `on_confirm` (no per-message future)."""

    async def confirm_frame(frame: spec.Basic.Ack | spec.Basic.Nack) -> None:
        HOOK_CALLS.confirms += 1
        on_confirm(frame)

    raw_channel._on_confirm_frame = confirm_frame


def hook_returns(raw_channel: Any, on_return: ReturnHook) -> None:
    """Route basic.return to `on_return` with the returned message's properties.

    aiormq would tie a return to a publish by message_id, which a producer chooses; the relay
    ties it by its own header instead. The channel's reader calls this before it reads the
    ack of the same message, so the return is always known when the ack settles the row.
    """

    async def return_frame(frame: spec.Basic.Return) -> None:
        HOOK_CALLS.returns += 1
        header = await raw_channel._get_frame()
        remaining = header.body_size
        while remaining > 0:
            remaining -= len((await raw_channel._get_frame()).value)
        on_return(frame, header.properties)

    raw_channel._on_return_frame = return_frame


def hook_broker_close(raw_channel: Any, on_close_frame: Callable[[str], None]) -> None:
    """Call `on_close_frame(reason)` when the broker's channel.close is read, before aiormq
    queues its close-ok.

    aiormq marks the channel closed (`is_closed`) only a few loop turns after it queued the
    close-ok; a frame written for the channel in between reaches the broker after the close-ok,
    on a channel number it has closed, and the broker closes the whole connection for it (504
    CHANNEL_ERROR "expected 'channel.open'"). The relay's writers check this first.
    """
    original = raw_channel._on_close_frame

    async def close_frame(frame: spec.Channel.Close) -> None:
        HOOK_CALLS.closes += 1
        exc = channel_exception_by_code(frame)
        on_close_frame(str(exc) or type(exc).__name__)
        await original(frame)

    raw_channel._on_close_frame = close_frame


def on_close(raw_channel: Any, callback: Callable[[BaseException | None], None]) -> None:
    """Call `callback(exception or None)` once the channel closes."""

    def closed(future: asyncio.Future[Any]) -> None:
        callback(None if future.cancelled() else future.exception())

    raw_channel.closing.add_done_callback(closed)


# How often a writer waiting for room in a full write queue (the broker blocks publishers, or
# the socket is slow) looks again.
QUEUE_FULL_RETRY_S = 0.02


async def write(raw_channel: Any, payload: bytes, timeout_s: float,
                closed: Callable[[], bool]) -> asyncio.Future[None] | None:
    """Queue pre-encoded frames on the connection's writer; return the drain future, or None
    when `closed()` says the channel takes nothing more.

    `closed()` is asked in the same loop turn as the frames are queued, never a turn before:
    a channel.close the broker sends is read between loop turns, and aiormq queues its
    close-ok at once; frames queued after that reach a closed channel number (504, the whole
    connection closes). So the queue is never awaited with the frames in hand: while it is
    full, the writer looks again every QUEUE_FULL_RETRY_S.

    Raises TimeoutError when the writer does not take them within `timeout_s` (the queue is
    bounded and the writer stops while the broker blocks publishers).
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + max(timeout_s, 0.0)
    queue: asyncio.Queue[ChannelFrame] = raw_channel.write_queue
    drain: asyncio.Future[None] = loop.create_future()
    while True:
        if closed():
            drain.cancel()
            return None
        try:
            queue.put_nowait(ChannelFrame(payload, False, drain))
            return drain
        except asyncio.QueueFull:
            if loop.time() >= until:
                drain.cancel()
                raise TimeoutError from None
        try:
            await asyncio.sleep(min(QUEUE_FULL_RETRY_S, max(until - loop.time(), 0.0)))
        except BaseException:
            drain.cancel()
            raise


BROKER_LOST = (aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError)
# A broker (or a load balancer in front of it) that accepts the TCP connection and closes it
# during the AMQP handshake: aiormq's frame reader can end with StopAsyncIteration (EOF seen
# before a frame) or EOFError instead of a connection error. The same outage.
HANDSHAKE_CUT = (StopAsyncIteration, EOFError, asyncio.IncompleteReadError)
CHANNEL_GONE = (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError)
AUTH_FAILED = (aiormq.exceptions.ProbableAuthenticationError,
               aiormq.exceptions.AuthenticationError)
NOT_FOUND = aiormq.exceptions.ChannelNotFoundEntity
CHANNEL_CLOSED = aiormq.exceptions.ChannelClosed
DELIVERY_ERROR = aiormq.exceptions.DeliveryError


def refused_for_good(exc: BaseException) -> bool:
    """The broker refused the login or the certificate: waiting will not change it. aiormq
    wraps such errors (in args or as the cause), so the whole chain is searched."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 20:
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, (*AUTH_FAILED, ssl.SSLCertVerificationError)):
            return True
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += [a for a in current.args if isinstance(a, BaseException)]
    return False
