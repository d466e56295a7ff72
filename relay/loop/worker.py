"""The relay loop: sweep, wait for a wake-up (or the poll / next due time), drain, stop.

It knows no driver: it talks to a Store and a Publisher (relay/interfaces.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from relay.errors import DatabaseError, InvalidRow
from relay.interfaces import (
    BatchObserver,
    Message,
    NoMetrics,
    OutboxRow,
    Publisher,
    PublishResult,
    Store,
)
from relay.loop import ordering
from relay.loop.retry import RetryPolicy, plan_settlement
from relay.options import parse_options
from relay.pg.wakeup import AlwaysNotified, WakeupGate
from relay.supervise import Backoff, Supervisor

log = structlog.get_logger("relay.loop.worker")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The loop's knobs (see relay/settings.py for their meaning)."""

    batch_size: int = 500
    concurrency: int = 3
    poll_interval_s: float = 5.0
    mandatory: bool = True
    max_message_bytes: int = 16 * 1024 * 1024
    retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(max_attempts=10, base_s=1.0, max_s=300.0)
    )
    db_retry_max_s: float = 30.0
    ordering_block_on_dead: bool = False


def _null_field(row: OutboxRow) -> str | None:
    """The reason a row of a classic (nullable) table can never be published, if any."""
    if row.content is None:
        return "content: NULL (a message needs a body; insert JSON, e.g. 'null'::jsonb)"
    if row.exchange is None:
        return "exchange: NULL (use '' for the default exchange)"
    return None


def build_messages(
    rows: Sequence[OutboxRow], *, mandatory: bool, max_message_bytes: int
) -> tuple[list[Message], dict[str, str]]:
    """Turn rows into messages; rows that can never be published come back with a reason."""
    messages: list[Message] = []
    invalid: dict[str, str] = {}
    for row in rows:
        fault = _null_field(row)
        if fault is not None:
            invalid[row.id] = fault
            continue
        assert row.content is not None
        assert row.exchange is not None
        body = row.content.encode()
        if len(body) > max_message_bytes:
            invalid[row.id] = (
                f"content: {len(body)} bytes exceeds the maximum message size "
                f"({max_message_bytes} bytes, RELAY_MAX_MESSAGE_BYTES)"
            )
            continue
        try:
            props = parse_options(row.options)
        except InvalidRow as exc:
            invalid[row.id] = str(exc)
            continue
        flag = mandatory if props.mandatory is None else props.mandatory
        # A NULL routing key (classic tables allow it) means the empty key, as in amqplib.
        key = row.routing_key or ""
        messages.append(Message(row.id, row.exchange, key, body, props, flag))
    return messages, invalid


class Worker:
    """Drains due rows with `concurrency` batches in flight; sleeps until woken or due."""

    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        config: WorkerConfig,
        *,
        metrics: BatchObserver | None = None,
        gate: WakeupGate | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.config = config
        self.metrics: BatchObserver = metrics or NoMetrics()
        self.gate: WakeupGate = gate or AlwaysNotified()
        self.claimed_total = 0
        self._claimed_at_sleep = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        # The pool's connection state; relay/app.py puts it among the process's supervisors.
        self.db_supervisor = Supervisor("database", backoff=Backoff(0.2, config.db_retry_max_s),
                                        stopping=self._stopping)
        self.published_total = 0
        self._last_had_keys = False
        self.last_loop_at = time.monotonic()

    def wake(self) -> None:
        """Ask for a sweep now (called on NOTIFY and after reconnects)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming; in-flight batches finish. Safe to call twice."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        """stop() was called."""
        return self._stopping.is_set()

    async def run(self) -> None:
        """Sweep at once, then drain on every wake-up until stop()."""
        self._wake.set()
        while not self.stopping:
            await self._sleep()
            self.last_loop_at = time.monotonic()
            self.metrics.loop_woke()
            if self.stopping:
                break
            self._wake.clear()
            await self._sweep()

    async def _sleep(self) -> None:
        """Wait for a wake-up, the poll interval or the next due row; the gate decides
        whether producers notify meanwhile and whether to sleep at all (relay/pg/wakeup.py)."""
        found = self.claimed_total - self._claimed_at_sleep
        self._claimed_at_sleep = self.claimed_total
        if self._wake.is_set() or self.gate.keep_sweeping(found):
            await self.gate.mark_awake()
            return
        plan = await self.gate.prepare_sleep(self._wake, found > 0)
        if plan.stay_awake:
            # Producers that saw this relay awake skipped the NOTIFY; the gate waited until
            # they all ended and saw rows due: drain them awake (lock released, so producers
            # do not notify meanwhile), then come back here to check again.
            await self.gate.mark_awake()
            return
        due_known, next_due_s = plan.due_known, plan.next_due_s
        if plan.sweep:
            # Rows are due but the last awake drain found none: one sweep holding the lock
            # (no producer can skip the NOTIFY meanwhile), then sleep.
            await self._sweep()
            due_known = False  # the sweep may have rescheduled rows: read the due time again
        timeout = await self._sleep_budget_s(due_known, next_due_s)
        cap = self.gate.sleep_cap_s()
        if cap is not None:
            timeout = min(timeout, cap)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=timeout)
        await self.gate.mark_awake()

    async def _sweep(self) -> None:
        """Drain once; on a failure back off (the database Supervisor) and ask for another.

        One attempt per sweep, so the loop keeps ticking (liveness) through a long outage.
        """
        db = self.db_supervisor
        try:
            await self.drain()
        except DatabaseError as exc:
            db.failed(exc)  # logged once per outage, and once on recovery
        except Exception as exc:
            # An unexpected error (a bug, a driver surprise) rolls its batch back; the
            # relay backs off and goes on rather than stopping the line for everyone.
            log.error("drain_failed", error=repr(exc), exc_info=True)
        else:
            db.ok()
            return
        await db.pause()
        self._wake.set()

    async def _sleep_budget_s(self, due_known: bool, next_due_s: float | None) -> float:
        """Poll interval, or less when a delayed row falls due sooner; the store is asked
        only when the gate did not read the due time."""
        if self._wake.is_set():
            return 0.0
        due = next_due_s
        if not due_known:
            try:
                due = await self.store.seconds_until_next_due()
            except DatabaseError:
                return self.config.poll_interval_s
        if due is None:
            return self.config.poll_interval_s
        return min(self.config.poll_interval_s, due + 0.005)

    async def drain(self) -> None:
        """Run `concurrency` lanes until none finds a full batch of due rows."""
        # A trickle fits one batch: claim it alone rather than with `concurrency` claims, two
        # of which would come back empty (this matters when sweeps come every few ms).
        if self.publisher.ready:
            claimed = await self.run_batch()
            short = claimed < self.config.batch_size and not (claimed and self._last_had_keys)
            if short and not self._wake.is_set():
                return
        lanes = [asyncio.ensure_future(self._lane()) for _ in range(self.config.concurrency)]
        try:
            await asyncio.gather(*lanes)
        finally:
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)

    async def _lane(self) -> None:
        while not self.stopping:
            if not self.publisher.ready:
                await self._wait_broker()
                if self.stopping:
                    return
            claimed = await self.run_batch()
            # A keyed claim is also bounded by the keys per batch, so a short batch with keyed
            # rows does not mean the backlog is empty: only an empty claim says that.
            if claimed < self.config.batch_size and not (claimed and self._last_had_keys):
                if self._wake.is_set() and not self.stopping:
                    # Rows were committed while this batch was in flight: claim them now
                    # instead of waiting for the other lanes to finish (steady-load latency).
                    # Cleared before the claim, so a commit racing it wakes us again.
                    self._wake.clear()
                    continue
                return

    async def _wait_broker(self) -> None:
        ready = asyncio.ensure_future(self.publisher.wait_ready())
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({ready, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ready, stop):
                task.cancel()
            await asyncio.gather(ready, stop, return_exceptions=True)

    async def run_batch(self) -> int:
        """Claim, publish, settle and commit one batch; return the number of rows claimed."""
        started = time.perf_counter()
        cfg = self.config
        async with self.store.claim(cfg.batch_size) as batch:
            rows = batch.rows
            self.claimed_total += len(rows)
            if not rows:
                return 0
            messages, invalid = build_messages(
                rows, mandatory=cfg.mandatory, max_message_bytes=cfg.max_message_bytes
            )
            block = cfg.ordering_block_on_dead
            messages = ordering.publishable(rows, messages, invalid, block_on_dead=block)
            publish_started = time.perf_counter()
            result = (
                await ordering.publish_in_waves(self.publisher, rows, messages)
                if messages
                else PublishResult()
            )
            publish_s = time.perf_counter() - publish_started if messages else 0.0
            confirmed_at = time.time()
            settlement = plan_settlement(rows, result, invalid, cfg.retry)
            held = ordering.hold_back(rows, settlement, block_on_dead=block)
            await batch.settle(settlement)
        self.published_total += len(settlement.published)
        self.metrics.observe_batch(
            rows, result, settlement, publish_s=publish_s,
            batch_s=time.perf_counter() - started, confirmed_at=confirmed_at,
        )
        if result.unsent:
            # Left untouched for a later pass; make sure one happens once the broker is back.
            self._wake.set()
        log.debug(
            "batch_settled",
            claimed=len(rows),
            published=len(settlement.published),
            retried=len(settlement.retry),
            dead=len(settlement.dead),
            unsent=len(result.unsent),
            held=held,
            elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
        )
        for row_id, error, delay_s in settlement.retry:
            log.info("publish_failed", id=row_id, error=error, retry_in_s=round(delay_s, 2))
        for row_id, reason, _ in settlement.dead:
            log.warning("dead_lettered", id=row_id, reason=reason)
        # Read by _lane right after this returns (no await in between, so lanes cannot mix).
        self._last_had_keys = any(r.ordering_key is not None for r in rows)
        return len(rows)
