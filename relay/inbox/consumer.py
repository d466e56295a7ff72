"""A RabbitMQ consumer whose handler runs at most once per message: the inbox (store.py) records
each message in the handler's own transaction, and the message is acked only after it commits.

Needs aio-pika and asyncpg only. Logs through the standard library's `logging`
(logger `relay.inbox`), so the application's own logging setup applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import aio_pika
import asyncpg
from aio_pika.abc import AbstractIncomingMessage

from relay.inbox.store import (
    DEFAULT_TABLE,
    Handler,
    Inbox,
    InboxError,
    ParkedMessage,
    message_key,
    session,
)
from relay.pg.compat import tune_socket

log = logging.getLogger("relay.inbox")

ON_ERROR = ("requeue", "reject")
# The database went away or refuses connections for now (restart, failover): not the message's
# fault, so it is requeued without counting an attempt, however long the outage lasts.
DATABASE_AWAY = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                 asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError)
# Attempts counted in this process for queues that do not count them (classic queues): the
# most recent keys only; a restarted consumer starts counting again.
_ATTEMPTS_KEPT = 10_000


class HandlerTimeout(Exception):
    """The handler's work got no answer in time (command_timeout_s, or its own `timeout=`)."""


class HandlerTooSlow(Exception):
    """The handler ran past handler_timeout_s: cancelled, its writes rolled back, counted as a
    failed attempt."""


@dataclass(frozen=True)
class ConsumerConfig:
    """How the consumer takes messages and what it does when the handler fails.

    queue: the queue to consume (it must exist).
    consumer: the name its messages are recorded under in the inbox (default: the queue's);
      two consumers sharing a name share their dedupe.
    table: the inbox table ([schema.]name), made by `relay inbox migrate`.
    prefetch: messages the broker sends ahead, unacked (basic.qos).
    concurrency: handlers running at once (each on its own database connection).
    on_error: when the handler raises: "requeue" (the broker delivers it again, until
      max_attempts) or "reject" (at once; to the queue's dead-letter exchange if it has one).
    max_attempts: deliveries before a message is given up: parked in the inbox's `_parked`
      table with the reason and rejected (to the queue's dead-letter exchange if it has one).
      Deliveries are counted in the inbox's `_attempts` table as they begin (and by quorum
      queues' x-delivery-count), so a message that kills the consumer's process is parked
      after max_attempts deliveries too.
    handler_timeout_s: the longest a handler may run (None: no bound); past it the handler is
      cancelled, its writes rolled back, and the attempt counts as failed.
    retention_s: inbox rows older than this are deleted every prune_every_s (None: never).
      A message re-delivered after its row was pruned runs again: keep this longer than the
      longest time a message can wait to be re-delivered (a relay or consumer outage).
    command_timeout_s: a statement on the handler's connection (the inbox's record, the
      handler's own, the commit) or a connect that gets no answer in this long is given up
      (cancelled, or the session closed when the cancel goes unanswered too) and the message
      requeued without counting an attempt (a link cut without a word, a server or pooler
      that hangs, another session still holding this message's record). One exception: a
      handler's own statement that ran out of time while the database answers a check (a
      slow query, a lock held elsewhere) is a counted failure, so a message whose work never
      finishes in time is rejected after max_attempts. A handler's statement that needs
      longer passes its own `timeout=`. The
      client's TCP keepalives follow it. The server's side is the server's (or the DSN's
      `options=-c tcp_keepalives_idle=...`): no startup setting is sent, which a pooler in
      front of the server could refuse.
    """

    queue: str
    consumer: str | None = None
    table: str = DEFAULT_TABLE
    prefetch: int = 100
    concurrency: int = 8
    on_error: str = "requeue"
    max_attempts: int = 5
    handler_timeout_s: float | None = 300.0
    retention_s: float | None = 7 * 86400.0
    prune_every_s: float = 600.0
    command_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> InboxError:
            return InboxError(f"inbox consumer setting {name}={getattr(self, name)!r}: {what}")

        if not self.queue:
            raise bad("queue", "give the queue to consume")
        if not 1 <= self.prefetch <= 65535:
            raise bad("prefetch", "between 1 and 65535 (AMQP's prefetch count is 16 bits)")
        if not 1 <= self.concurrency <= self.prefetch:
            raise bad("concurrency", "at least 1 and at most prefetch (more could never run)")
        if self.on_error not in ON_ERROR:
            raise bad("on_error", "'requeue' or 'reject'")
        if self.max_attempts < 1:
            raise bad("max_attempts", "at least 1")
        if self.handler_timeout_s is not None and not (
                math.isfinite(self.handler_timeout_s) and self.handler_timeout_s > 0):
            raise bad("handler_timeout_s", "a positive number of seconds, or None for no bound")
        if self.retention_s is not None and not (math.isfinite(self.retention_s)
                                                 and self.retention_s > 0):
            raise bad("retention_s", "a positive number of seconds, or None to keep every row")
        if not (math.isfinite(self.prune_every_s) and self.prune_every_s > 0):
            raise bad("prune_every_s", "a positive number of seconds")
        if not (math.isfinite(self.command_timeout_s) and 3 <= self.command_timeout_s <= 86400):
            raise bad("command_timeout_s", "between 3 and 86400 seconds")

    @property
    def name(self) -> str:
        """The name messages are recorded under."""
        return self.consumer or self.queue

    def pool_args(self) -> dict[str, Any]:
        """asyncpg.create_pool() arguments for command_timeout_s: the statements' and the
        connect's bound, and the client's TCP keepalives on each session's socket (the first
        probe after a third of the bound without traffic, then every sixth; unanswered probes
        or unacknowledged data for the whole bound end the session)."""
        idle = max(1, int(self.command_timeout_s / 3))
        interval = max(1, int(self.command_timeout_s / 6))
        user_timeout_ms = int(self.command_timeout_s * 1000)

        async def tune(conn: Any) -> None:
            tune_socket(conn, idle_s=idle, interval_s=interval, user_timeout_ms=user_timeout_ms)

        return {"command_timeout": self.command_timeout_s, "timeout": self.command_timeout_s,
                "init": tune}


def delivery_attempt(message: AbstractIncomingMessage, counted: int) -> int:
    """This delivery's number (1 for the first): the broker's x-delivery-count when it keeps
    one (quorum queues), else `counted`, this process's own count."""
    count = (message.headers or {}).get("x-delivery-count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count + 1
    return counted


class InboxConsumer:
    """Consumes `config.queue`, running `handler(message, conn)` once per message.

    For each message: in one transaction on `conn`, the inbox records the message's key and, if
    new, the handler runs; the transaction commits, then the message is acked. A message already
    recorded is acked without running the handler. When the handler raises, the transaction
    rolls back and the message is requeued or rejected as `config.on_error` says.
    """

    def __init__(self, amqp_url: str, pg_dsn: str, handler: Handler,
                 config: ConsumerConfig) -> None:
        self.amqp_url = amqp_url
        self.pg_dsn = pg_dsn
        self.handler = handler
        self.config = config
        self.handled = 0
        self.duplicates = 0
        self.failed = 0
        self.database_away = 0  # messages requeued because the database was away
        self.parked = 0  # messages given up, kept in the inbox's _parked table
        self._attempts: OrderedDict[str, int] = OrderedDict()
        self._slots = asyncio.Semaphore(config.concurrency)
        self._lanes = Lanes()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until `stop` is set (or the task is cancelled); then finish the handlers
        running, and close."""
        cfg = self.config
        pool = await asyncpg.create_pool(self.pg_dsn, min_size=1, max_size=cfg.concurrency,
                                         **cfg.pool_args())
        try:
            inbox = Inbox(pool, cfg.name, cfg.table)
            await inbox.check()
            connection = await aio_pika.connect_robust(self.amqp_url)
            try:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=cfg.prefetch)
                queue = await channel.get_queue(cfg.queue, ensure=True)

                async def on_message(message: AbstractIncomingMessage) -> None:
                    await self._one(inbox, message)

                tag = await queue.consume(on_message)
                log.info("inbox consumer started: queue %s as %s, table %s", cfg.queue,
                         cfg.name, cfg.table)
                pruner = asyncio.create_task(self._prune(inbox))
                try:
                    await (stop.wait() if stop is not None else asyncio.Future())
                finally:
                    pruner.cancel()
                    with contextlib.suppress(Exception):
                        await queue.cancel(tag)
                    await self._drain_handlers(timeout_s=30.0)
            finally:
                await connection.close()
        finally:
            try:  # a handler still running past its drain keeps its connection
                await asyncio.wait_for(pool.close(), cfg.command_timeout_s)
            except TimeoutError:
                pool.terminate()

    async def _one(self, inbox: Inbox, message: AbstractIncomingMessage) -> None:
        async with self._slots:
            key = message_key(message.headers, message.message_id)
            if key is None:
                log.error("message without x-outbox-id or message_id on %s (delivery tag %s): "
                          "rejected, nothing to tell a duplicate by", self.config.queue,
                          message.delivery_tag)
                await _settle(message.reject(requeue=False), "(no id)")
                return
            # A message delivered again may be the one that killed or hung the last process: it
            # runs alone, so that a death counts against it and not against its neighbours.
            async with (self._lanes.alone() if message.redelivered else self._lanes.shared()):
                await self._handle(inbox, key, message)

    async def _handle(self, inbox: Inbox, key: str, message: AbstractIncomingMessage) -> None:
        """Count, run, settle one message (in its lane)."""
        attempt = 1
        try:
            attempt = await self._attempt(inbox, key, message)
            if attempt > self.config.max_attempts:
                await self._past_attempts(inbox, key, message, attempt)
                return
            ran = await inbox.handle(key, message, self._run_handler,
                                     counted=bool(message.redelivered))
        except HandlerTimeout as exc:
            if not await self._database_answers():
                await self._database_away(key, message, exc)
                return
            # The handler's work (a slow query, a lock held elsewhere) outlasted the bound
            # while the database answers: counted, so a message that never finishes in
            # time is rejected after max_attempts instead of coming back for ever.
            self.failed += 1
            await self._failed(inbox, key, message, exc, attempt)
            return
        except DATABASE_AWAY as exc:
            await self._database_away(key, message, exc)
            return
        except Exception as exc:
            self.failed += 1
            await self._failed(inbox, key, message, exc, attempt)
            return
        if ran:
            self.handled += 1
        else:
            self.duplicates += 1
            log.info("message %s handled before; acked without running the handler", key)
        self._attempts.pop(key, None)
        await _settle(message.ack(), key)

    async def _attempt(self, inbox: Inbox, key: str, message: AbstractIncomingMessage) -> int:
        """This delivery's number: 1 for a first delivery; for one the broker made again, the
        count the inbox keeps (committed before the handler runs, so it outlives a process
        that dies in the handler), the broker's own (quorum queues) or this process's, the
        highest."""
        counted = self._attempts.get(key, 0) + 1
        attempt = delivery_attempt(message, counted)
        if message.redelivered:
            attempt = max(attempt, await inbox.count_attempt(key))
        return attempt

    async def _past_attempts(self, inbox: Inbox, key: str, message: AbstractIncomingMessage,
                             attempt: int) -> None:
        """A message delivered more than max_attempts times with no outcome (its handler
        killed the process, or hung it, every time): parked without running the handler,
        unless it was handled or parked before."""
        known = await inbox.outcome_known(key)
        if known == "handled":
            self.duplicates += 1
            await _settle(message.ack(), key)
            return
        if known is None:
            await self._park(inbox, key, message, attempt,
                             f"delivered {attempt} times without an outcome: the consumer "
                             "died or hung in the handler each time")
        await _settle(message.reject(requeue=False), key)

    async def _park(self, inbox: Inbox, key: str, message: AbstractIncomingMessage,
                    attempt: int, reason: str) -> None:
        self.parked += 1
        self._attempts.pop(key, None)
        await inbox.park(key, ParkedMessage(message.exchange, message.routing_key,
                                            dict(message.headers or {}), message.body),
                         reason, attempt)
        log.error("message %s parked in the inbox after %d deliveries: %s", key, attempt,
                  reason)

    async def _database_away(self, key: str, message: AbstractIncomingMessage,
                             exc: Exception) -> None:
        """The database went away: not the message's fault; it comes back."""
        self.database_away += 1
        log.warning("inbox database unavailable (%r); message %s requeued", exc, key)
        await asyncio.sleep(1.0)
        await _settle(message.nack(requeue=True), key)

    async def _run_handler(self, message: AbstractIncomingMessage, conn: Any) -> None:
        bound_s = self.config.handler_timeout_s
        try:
            async with asyncio.timeout(bound_s) as bound:
                await self.handler(message, conn)
        except TimeoutError as exc:
            if bound.expired():
                raise HandlerTooSlow(f"the handler ran past handler_timeout_s={bound_s:g}s: "
                                     "cancelled, its writes rolled back") from None
            raise HandlerTimeout(
                f"the handler's work got no answer within command_timeout_s="
                f"{self.config.command_timeout_s:g}s (or its own timeout=)") from exc

    async def _database_answers(self) -> bool:
        """The database answers a trivial statement on a session of its own (the pool's may
        all be busy with the slow work), within half of command_timeout_s (at most 5 s)."""
        async def check() -> None:
            async with session(self.pg_dsn) as conn:
                await conn.fetchval("SELECT 1")

        try:
            await asyncio.wait_for(check(), min(5.0, self.config.command_timeout_s / 2))
        except (TimeoutError, InboxError, *DATABASE_AWAY, asyncpg.PostgresError):
            return False
        return True

    async def _failed(self, inbox: Inbox, key: str, message: AbstractIncomingMessage,
                      exc: Exception, attempt: int) -> None:
        give_up = self.config.on_error == "reject" or attempt >= self.config.max_attempts
        log.warning("handler failed for message %s (attempt %d of %d): %r; %s", key, attempt,
                    self.config.max_attempts, exc, "parked" if give_up else "requeued")
        if give_up:
            try:
                await self._park(inbox, key, message, attempt,
                                 f"the handler failed on attempt {attempt}: {exc!r}")
            except Exception as park_failed:  # the message comes back: nothing is lost
                await self._database_away(key, message, park_failed)
                return
            await _settle(message.reject(requeue=False), key)
            return
        self._attempts[key] = attempt
        while len(self._attempts) > _ATTEMPTS_KEPT:
            self._attempts.popitem(last=False)
        await _settle(message.nack(requeue=True), key)

    async def _drain_handlers(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the handlers running to finish."""
        async def all_slots() -> None:
            for _ in range(self.config.concurrency):
                await self._slots.acquire()

        try:
            await asyncio.wait_for(all_slots(), timeout_s)
        except TimeoutError:
            log.warning("inbox consumer stopping with handlers still running after %.0f s; "
                        "their messages are delivered again", timeout_s)

    async def _prune(self, inbox: Inbox) -> None:
        if self.config.retention_s is None:
            return
        while True:
            try:
                deleted = await inbox.prune(self.config.retention_s)
                if deleted:
                    log.info("inbox pruned: %d rows older than %.0f s", deleted,
                             self.config.retention_s)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("inbox prune failed (%s); next try in %.0f s", exc,
                            self.config.prune_every_s)
            await asyncio.sleep(self.config.prune_every_s)


class Lanes:
    """Handlers run side by side (shared), except one that must run alone: it waits until the
    others finished, and none starts while it runs or waits (so it is never starved)."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._running = 0
        self._alone = False
        self._waiting_alone = 0

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Run beside other shared handlers."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._running += 1
        try:
            yield
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Run with nothing beside."""
        async with self._changed:
            self._waiting_alone += 1
            try:
                await self._changed.wait_for(lambda: not self._alone and not self._running)
            finally:
                self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()


async def _settle(answer: Awaitable[None], key: str) -> None:
    """Ack, nack or reject; when the channel is gone the broker delivers the message again, and
    the inbox knows it if its transaction committed."""
    try:
        await answer
    except Exception as exc:
        log.warning("could not answer the broker for message %s (%r): it will be delivered "
                    "again", key, exc)


async def consume(amqp_url: str, pg_dsn: str, handler: Handler, config: ConsumerConfig,
                  stop: asyncio.Event | None = None) -> InboxConsumer:
    """Run an InboxConsumer until `stop` is set; return it (its counts)."""
    consumer = InboxConsumer(amqp_url, pg_dsn, handler, config)
    await consumer.run(stop)
    return consumer


