"""The broker connection: opened and reopened under a Supervisor, over a list of nodes.

One aio-pika connection per relay process. It is (re)established through
relay.supervise.Supervisor (capped jittered backoff, one log line per outage and one on
recovery, state for /healthz), moving to the next node of RELAY_AMQP_URL after a failure. It
also owns the side channel that checks exchanges (passively, cached) and reads connection.blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aio_pika
import structlog

from relay.amqp import compat
from relay.amqp.nodes import Nodes, broker_user, node_label
from relay.dsn import redact
from relay.errors import BrokerError, BrokerRefusedAtStart
from relay.supervise import Supervisor

log = structlog.get_logger("relay.amqp.connection")

# aiormq and aio-pika log every failed reconnect attempt and every dropped connection; the
# supervisor logs each outage once (connection_lost ... connection_restored).
for _name in ("aiormq.connection", "aio_pika.connection", "aio_pika.robust_connection"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

OnOpen = Callable[[Any], Awaitable[None]]


class BrokerUnreachable(BrokerError):
    """No connection now; the supervisor tries again (any other BrokerError is final)."""


class BrokerRefused(BrokerUnreachable):
    """The broker refused credentials or a certificate it accepted before: retried."""


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


class BrokerConnection:
    """A supervised connection to one of the broker nodes; see the module docstring."""

    def __init__(
        self,
        urls: str,
        *,
        supervisor: Supervisor | None = None,
        connection_name: str | None = None,
        role: str = "",
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.nodes = Nodes(urls)
        self.supervisor = supervisor or Supervisor("broker", describe=redact(urls))
        # Unique per process (as application_name is on PostgreSQL), so an operator can tell
        # the relays' connections apart in the management UI and close one by name; a
        # second connection of the process says its `role` (outbox-relay-express host pid).
        prefix = f"outbox-relay-{role}" if role else "outbox-relay"
        self.connection_name = connection_name or (
            f"{prefix} {socket.gethostname()} {os.getpid()}"
        )
        self.connect_timeout_s = connect_timeout_s
        self.user = broker_user(self.nodes.current)
        self.exchanges = ExchangeCache()
        self.raw: Any = None  # the aio-pika connection
        self._side: Any = None
        self._on_open: list[OnOpen] = []
        self._connect_lock = asyncio.Lock()
        self._blocked_logged = False
        self.opened = 0  # connections opened by this process (a reconnect storm shows here)
        # The node of the open connection (host:port; None before the first), and how many
        # times a new connection went to another node than the one before (failovers).
        self.node: str | None = None
        self.failovers = 0
        self.supervisor.details = lambda: {"node": self.node, "failovers": self.failovers}

    def on_open(self, callback: OnOpen) -> None:
        """Run `callback(connection)` after every (re)connect, before the connection is used."""
        self._on_open.append(callback)

    # ------------------------------------------------------------------ lifecycle

    async def _attempt(self) -> None:
        url = self.nodes.current
        try:
            raw = await asyncio.wait_for(
                aio_pika.connect(url, client_properties={"connection_name": self.connection_name}),
                timeout=self.connect_timeout_s,
            )
        except (TimeoutError, *compat.BROKER_LOST, *compat.HANDSHAKE_CUT) as exc:
            if compat.refused_for_good(exc):
                if not self.supervisor.ever_up:
                    # At start-up, refused credentials or an untrusted certificate are a
                    # configuration error: waiting will not change them.
                    raise BrokerRefusedAtStart(f"RabbitMQ at {redact(url)} refused the "
                                               f"connection: {exc}") from exc
                # After the relay has run with them, they were changed under it (a rotated
                # password, a renewed certificate): an outage like any other, retried with
                # the supervisor's capped backoff until the new ones are in place.
                raise BrokerRefused(
                    f"RabbitMQ at {redact(url)} refused the relay's credentials or "
                    f"certificate (changed since start?): {exc}") from exc
            self.nodes.advance()
            raise BrokerUnreachable(f"cannot reach RabbitMQ at {redact(url)}: "
                                    f"{exc or type(exc).__name__}") from exc
        self.opened += 1
        self.raw = raw
        node = node_label(url)
        if self.node is not None and node != self.node:
            self.failovers += 1
            log.info("broker_failover", node=node, previous=self.node, failovers=self.failovers)
        self.node = node
        try:
            self._side = await raw.channel(publisher_confirms=False)
            for callback in self._on_open:
                await callback(raw)
        except (TimeoutError, RuntimeError, *compat.BROKER_LOST, *compat.CHANNEL_GONE) as exc:
            # aio-pika raises RuntimeError for a channel on a connection that just closed.
            await self._drop()
            self.nodes.advance()
            raise BrokerUnreachable(f"opening channels on {redact(url)} failed: {exc}") from exc

    async def connect(self) -> None:
        """Connect (waiting for the broker as the supervisor allows); raises BrokerError for
        a fault that retrying cannot fix (the broker libraries lack what the relay uses)."""
        async with self._connect_lock:
            if not self.connected:
                await self._drop()
                await self.supervisor.establish(self._attempt, retry_on=(BrokerUnreachable,))

    async def close(self) -> None:
        """Close the connection; safe to call twice."""
        await self._drop()

    async def _drop(self) -> None:
        raw, self.raw, self._side = self.raw, None, None
        if raw is not None:
            try:
                await asyncio.wait_for(raw.close(), timeout=5)
            except Exception as exc:
                log.debug("broker_close_failed", error=str(exc))

    async def abandon(self, why: str) -> None:
        """Close a connection that looks alive but is not (the broker went silent)."""
        if self.raw is not None:
            self.supervisor.lost(why)
            self.nodes.advance()
            await self._drop()

    # ------------------------------------------------------------------ state

    @property
    def connected(self) -> bool:
        """The connection is open."""
        raw = self.raw
        if raw is None or raw.is_closed:
            return False
        event = getattr(raw, "connected", None)
        if isinstance(event, asyncio.Event) and not event.is_set():
            return False
        return not compat.underlay_closed(raw)

    @property
    def blocked(self) -> bool:
        """The broker sent connection.blocked (memory or disk alarm) and not yet unblocked."""
        if not self.connected:
            return False
        event = compat.unblocked_event(self.raw)
        return event is not None and not event.is_set()

    @property
    def ready(self) -> bool:
        """Connected and not blocked."""
        return self.connected and not self.blocked

    async def wait_unblocked(self, deadline: float) -> bool:
        """Wait until unblocked or the deadline (loop time); return whether it can publish."""
        loop = asyncio.get_running_loop()
        while self.connected and self.blocked:
            event = compat.unblocked_event(self.raw)
            left = deadline - loop.time()
            if event is None or left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 1.0)):
                    await event.wait()
        return self.ready

    async def wait_ready(self) -> None:
        """Reconnect (supervised) until connected, then wait until unblocked.

        Logs once per outage (the supervisor) and once per flow-control episode
        (broker_blocked ... broker_unblocked), however many lanes wait.
        """
        if not self.connected:
            if self.raw is not None or self.supervisor.up:
                self.supervisor.lost("connection closed")
            await self.connect()
        if self.blocked and not self._blocked_logged:
            log.warning("broker_blocked", detail="connection.blocked: claiming paused")
            self._blocked_logged = True
        while self.blocked:
            await self.wait_unblocked(asyncio.get_running_loop().time() + 1.0)
            if self.supervisor.stopping.is_set():
                return
        if self._blocked_logged and not self.blocked:
            log.info("broker_unblocked")
            self._blocked_logged = False

    # ------------------------------------------------------------------ channels

    async def channel(self, *, confirms: bool) -> Any:
        """A new aio-pika channel on the current connection."""
        if self.raw is None:
            raise BrokerError("not connected")
        return await self.raw.channel(publisher_confirms=confirms, on_return_raises=False)

    async def answers(self, timeout_s: float) -> bool:
        """The broker answers a request on this connection within `timeout_s` (a passive
        declare of amq.direct, which every vhost has): it is alive, whatever a queue does."""
        try:
            if self._side is None or self._side.is_closed:
                self._side = await asyncio.wait_for(self.channel(confirms=False),
                                                    timeout=timeout_s)
            await asyncio.wait_for(self._side.get_exchange("amq.direct", ensure=True),
                                   timeout=timeout_s)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return False
        except (TimeoutError, RuntimeError, *compat.BROKER_LOST, *compat.CHANNEL_GONE,
                compat.NOT_FOUND):
            self._side = None
            return False
        return True

    async def missing_exchanges(self, names: set[str]) -> set[str]:
        """Exchanges among `names` that do not exist (checked passively, cached)."""
        now = asyncio.get_running_loop().time()
        missing: set[str] = set()
        for name in names:
            if self.exchanges.known(name, now):
                continue
            if self._side is None or self._side.is_closed:
                self._side = await self.channel(confirms=False)
            try:
                await self._side.get_exchange(name, ensure=True)
                self.exchanges.remember(name, now)
            except compat.NOT_FOUND:
                missing.add(name)
                self._side = None  # the 404 closed it
        return missing
