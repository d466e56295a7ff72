"""The broker side: one long-lived confirm channel, pipelined publishes, returns tied to rows.

aio-pika owns the connection and channel lifecycle; publishes go through its aiormq channel so
that a basic.return resolves the publish it belongs to instead of being acked as delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq
import structlog
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from relay.errors import BrokerError
from relay.interfaces import Message, PublishResult
from relay.options import Properties
from relay.settings import redact_url

log = structlog.get_logger("relay.amqp.publisher")

# aiormq and aio-pika log every failed reconnect attempt and every dropped connection; the
# publisher logs each outage once itself (broker_connection_lost ... broker_reconnected).
for _name in ("aiormq.connection", "aio_pika.connection", "aio_pika.robust_connection"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

OUTBOX_ID_HEADER = "x-outbox-id"
_BROKER_LOST = (aiormq.exceptions.AMQPConnectionError, ConnectionError, OSError)
_CHANNEL_GONE = (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError)


def amqp_properties(message: Message) -> spec.Basic.Properties:
    """Map a message's properties to pamqp's; the row id is the message_id unless overridden."""
    p: Properties = message.properties
    headers = p.headers
    if p.message_id is not None and p.message_id != message.id:
        headers = {**(headers or {}), OUTBOX_ID_HEADER: message.id}
    return spec.Basic.Properties(
        content_type=p.content_type,
        content_encoding=p.content_encoding,
        headers=headers,
        delivery_mode=p.delivery_mode,
        priority=p.priority,
        correlation_id=p.correlation_id,
        reply_to=p.reply_to,
        expiration=p.expiration,
        message_id=p.message_id or message.id,
        timestamp=p.timestamp,
        message_type=p.type,
        user_id=p.user_id,
        app_id=p.app_id,
    )


def _row_id_of(returned: DeliveredMessage) -> str | None:
    props = returned.header.properties
    headers = props.headers or {}
    value = headers.get(OUTBOX_ID_HEADER, props.message_id)
    return None if value is None else str(value)


class ExchangeCache:
    """Remembers which exchanges exist for a while, so a batch is checked without round trips."""

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._seen: dict[str, float] = {}

    def known(self, name: str, now: float) -> bool:
        """True when the exchange was seen recently (the default exchange always exists)."""
        if name == "":
            return True
        seen = self._seen.get(name)
        return seen is not None and now - seen < self.ttl_s

    def remember(self, name: str, now: float) -> None:
        """Record that the exchange exists."""
        self._seen[name] = now

    def forget(self, names: Iterable[str] | None = None) -> None:
        """Drop some or all entries (after a channel close)."""
        if names is None:
            self._seen.clear()
        for name in names or ():
            self._seen.pop(name, None)


class AmqpPublisher:
    """Publishes batches on one confirm channel; reconnects with capped backoff and jitter."""

    def __init__(
        self,
        url: str,
        *,
        publish_timeout_s: float,
        reconnect_max_s: float,
        connection_name: str = "outbox-relay",
    ) -> None:
        self.url = url
        self.publish_timeout_s = publish_timeout_s
        self.reconnect_max_s = reconnect_max_s
        self.connection_name = connection_name
        self.exchanges = ExchangeCache()
        self._connection: Any = None
        self._channel: Any = None
        self._side: Any = None
        self._lock = asyncio.Lock()
        # Lanes call wait_ready() together after a loss: one of them reconnects, the others wait.
        self._connect_lock = asyncio.Lock()
        self._outage_logged = False
        self._outage_started = 0.0
        self._blocked_logged = False
        self._close_reason: str | None = None
        # RabbitMQ closes the channel for a user_id other than the connection's own user.
        self._user = unquote(urlsplit(url).username or "guest")

    # ------------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        """Open the connection and channels; raise BrokerError with a clear reason."""
        try:
            self._connection = await aio_pika.connect(
                self.url, client_properties={"connection_name": self.connection_name}
            )
            await self._open_channels()
        except (TimeoutError, *_BROKER_LOST) as exc:
            await self._drop()
            raise BrokerError(f"cannot reach RabbitMQ at {redact_url(self.url)}: {exc}") from exc

    async def _open_channels(self) -> None:
        self._channel = await self._connection.channel(
            publisher_confirms=True, on_return_raises=False
        )
        self._side = await self._connection.channel(publisher_confirms=False)

    async def close(self) -> None:
        """Close channels and connection; safe to call twice."""
        await self._drop()

    async def _drop(self) -> None:
        conn, self._connection, self._channel, self._side = self._connection, None, None, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), timeout=5)
            except Exception as exc:
                log.debug("broker_close_failed", error=str(exc))

    @property
    def connected(self) -> bool:
        """The connection is open."""
        conn = self._connection
        if conn is None or conn.is_closed:
            return False
        # aio-pika >= 10 only marks `is_closed` on an explicit close(); a connection the broker
        # dropped shows in its `connected` event and in the underlying aiormq connection.
        event = getattr(conn, "connected", None)
        if isinstance(event, asyncio.Event) and not event.is_set():
            return False
        underlay = getattr(getattr(conn, "transport", None), "connection", None)
        return not bool(getattr(underlay, "is_closed", False))

    def _unblocked_event(self) -> asyncio.Event | None:
        # aiormq keeps connection.blocked state in a private event; read it, never set it.
        raw = getattr(self._connection, "transport", None)
        aiormq_conn = getattr(raw, "connection", None)
        event = getattr(aiormq_conn, "_Connection__connection_unblocked", None)
        return event if isinstance(event, asyncio.Event) else None

    @property
    def blocked(self) -> bool:
        """The broker sent connection.blocked (memory or disk alarm) and not yet unblocked."""
        if not self.connected:
            return False
        event = self._unblocked_event()
        return event is not None and not event.is_set()

    @property
    def ready(self) -> bool:
        """Connected and not blocked."""
        return self.connected and not self.blocked

    async def wait_ready(self) -> None:
        """Reconnect with capped exponential backoff and jitter until connected and unblocked.

        Logs once per outage (broker_connection_lost ... broker_reconnected) and once per
        flow-control episode (broker_blocked ... broker_unblocked), however many lanes wait.
        """
        async with self._connect_lock:
            await self._reconnect()
            if self.blocked and not self._blocked_logged:
                log.warning("broker_blocked", detail="connection.blocked: claiming paused")
                self._blocked_logged = True
            while self.connected and self.blocked:
                event = self._unblocked_event()
                if event is None:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=1.0)
            if self._blocked_logged and not self.blocked:
                log.info("broker_unblocked")
                self._blocked_logged = False

    async def _reconnect(self) -> None:
        delay = 0.2
        attempts = 0
        while not self.connected:
            loop = asyncio.get_running_loop()
            if not self._outage_logged:
                log.warning("broker_connection_lost", url=redact_url(self.url))
                self._outage_logged = True
                self._outage_started = loop.time()
            attempts += 1
            try:
                await self._drop()
                await self.connect()
            except BrokerError as exc:
                log.debug("broker_reconnect_failed", attempt=attempts, error=str(exc))
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self.reconnect_max_s)
        if self._outage_logged:
            elapsed = asyncio.get_running_loop().time() - self._outage_started
            log.info("broker_reconnected", attempts=attempts, outage_s=round(elapsed, 1))
            self._outage_logged = False

    # ------------------------------------------------------------------ publishing

    async def _missing_exchanges(self, names: set[str]) -> set[str]:
        now = asyncio.get_running_loop().time()
        missing: set[str] = set()
        for name in names:
            if self.exchanges.known(name, now):
                continue
            try:
                await self._side.get_exchange(name, ensure=True)
                self.exchanges.remember(name, now)
            except aiormq.exceptions.ChannelNotFoundEntity:
                missing.add(name)
                self._side = await self._connection.channel(publisher_confirms=False)
        return missing

    async def _reopen_channels(self) -> None:
        old_side = self._side
        await self._open_channels()
        if old_side is not None:
            with contextlib.suppress(Exception):
                await old_side.close()

    async def publish(self, messages: Sequence[Message]) -> PublishResult:
        """Publish with confirms pipelined; settle every message as confirmed, failed or unsent.

        After the broker closes the channel (a row it refuses at the protocol level: an exchange
        deleted since the check, a user_id that is not the connection's, a body over its
        max_message_size), the rest of the batch is published one message at a time on a new
        channel, so that only the offending rows fail and the others are delivered.
        """
        result = PublishResult()
        pending = self._refuse_foreign_user_ids(messages, result)
        isolate = False
        async with self._lock:
            for _ in range(3):
                if not pending or not self.connected or self.blocked:
                    break
                try:
                    missing = await self._missing_exchanges({m.exchange for m in pending})
                except (*_CHANNEL_GONE, *_BROKER_LOST):
                    break
                sendable = []
                for m in pending:
                    if m.exchange in missing:
                        result.failed[m.id] = f"exchange {m.exchange!r} not found"
                    else:
                        sendable.append(m)
                if isolate:
                    pending = await self._publish_isolated(sendable, result)
                else:
                    pending = await self._publish_once(sendable, result)
                if pending and self.connected and not self.blocked:
                    # Everything unconfirmed on the closed channel counts as not published.
                    self.exchanges.forget()
                    isolate = True
                    try:
                        await self._reopen_channels()
                    except (*_CHANNEL_GONE, *_BROKER_LOST):
                        break
        if pending:
            result.unsent.extend(m.id for m in pending)
            result.broker_lost = not self.connected
        return result

    def _refuse_foreign_user_ids(
        self, messages: Sequence[Message], result: PublishResult
    ) -> list[Message]:
        pending = []
        for m in messages:
            uid = m.properties.user_id
            if uid is not None and uid != self._user:
                result.invalid[m.id] = (
                    f"options.userId: {uid!r} is not the relay's broker user {self._user!r} "
                    "(RabbitMQ refuses it)"
                )
            else:
                pending.append(m)
        return pending

    async def _publish_isolated(
        self, messages: list[Message], result: PublishResult
    ) -> list[Message]:
        """Publish one message at a time; a message that closes the channel alone is failed."""
        for index, m in enumerate(messages):
            self._close_reason = None
            lost = await self._publish_once([m], result)
            if not lost:
                continue
            if not self.connected or self.blocked or self._close_reason is None:
                return messages[index:]
            result.failed[m.id] = f"channel closed by the broker: {self._close_reason}"
            try:
                await self._reopen_channels()
            except (*_CHANNEL_GONE, *_BROKER_LOST):
                return messages[index + 1 :]
        return []

    async def _publish_once(self, messages: list[Message], result: PublishResult) -> list[Message]:
        """One pipelined pass; returns the messages whose fate is unknown (channel lost)."""
        if not messages:
            return []
        try:
            raw = await self._channel.get_underlay_channel()
        except (*_CHANNEL_GONE, *_BROKER_LOST, AttributeError):
            return messages
        tasks = [
            asyncio.ensure_future(
                raw.basic_publish(
                    m.body,
                    exchange=m.exchange,
                    routing_key=m.routing_key,
                    properties=amqp_properties(m),
                    mandatory=m.mandatory,
                )
            )
            for m in messages
        ]
        _done, not_done = await asyncio.wait(tasks, timeout=self.publish_timeout_s)
        for task in not_done:
            task.cancel()
        returned: set[str] = set()
        outcomes: list[tuple[Message, object]] = []
        for m, task in zip(messages, tasks, strict=True):
            if task in not_done:
                outcomes.append((m, TimeoutError()))
                continue
            outcome: object
            if task.cancelled():
                outcome = asyncio.CancelledError()
            else:
                exc = task.exception()
                outcome = exc if exc is not None else task.result()
            if isinstance(outcome, DeliveredMessage):
                rid = _row_id_of(outcome)
                if rid is not None:
                    returned.add(rid)
            outcomes.append((m, outcome))
        lost: list[Message] = []
        for m, outcome in outcomes:
            self._classify(m, outcome, returned, result, lost)
        return lost

    def _classify(
        self,
        m: Message,
        outcome: object,
        returned: set[str],
        result: PublishResult,
        lost: list[Message],
    ) -> None:
        if isinstance(outcome, spec.Basic.Ack) and m.id not in returned:
            result.confirmed.append(m.id)
        elif isinstance(outcome, spec.Basic.Ack | DeliveredMessage):
            reason = "unroutable: returned by the broker (no queue bound for "
            result.failed[m.id] = reason + f"exchange {m.exchange!r}, key {m.routing_key!r})"
        elif isinstance(outcome, TimeoutError) and self.blocked:
            # connection.blocked holds publishes back: not the row's fault, publish it later.
            lost.append(m)
        elif isinstance(outcome, TimeoutError):
            result.failed[m.id] = f"confirm timeout after {self.publish_timeout_s:g}s"
        elif isinstance(outcome, aiormq.exceptions.DeliveryError):
            result.failed[m.id] = "nacked by the broker"
        elif isinstance(outcome, aiormq.exceptions.ChannelNotFoundEntity):
            self.exchanges.forget([m.exchange])
            self._close_reason = f"exchange {m.exchange!r} not found ({outcome})"
            lost.append(m)
        elif isinstance(outcome, aiormq.exceptions.ChannelClosed):
            self._close_reason = str(outcome)
            lost.append(m)
        elif isinstance(outcome, (*_CHANNEL_GONE, asyncio.CancelledError, *_BROKER_LOST)):
            lost.append(m)
        else:
            result.failed[m.id] = f"publish failed: {outcome!r}"
