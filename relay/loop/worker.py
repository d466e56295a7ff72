"""The relay loop: sweep, wait for a wake-up (or the poll / next due time), drain, stop.

It knows no driver: it talks to a Store and a Publisher (relay/interfaces.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import structlog

from relay.errors import DatabaseError
from relay.interfaces import (
    BatchObserver,
    ExpressStore,
    Kind,
    NoMetrics,
    Publisher,
    Store,
    WakeupLock,
)
from relay.loop.batch import BatchPlan, BatchReport, Stage, cancel_claiming, run_batch
from relay.loop.budget import LaneBytes
from relay.loop.express import EXPRESS_ROWS, ExpressLane
from relay.loop.retry import RetryPolicy
from relay.loop.sleep import Doorbell, Sleeper, SleepTimes
from relay.supervise import Backoff, Supervisor
from relay.tracing import NO_SWEEP, NoTracing, Tracing

log = structlog.get_logger("relay.loop.worker")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The loop's knobs (see relay/settings.py for their meaning)."""

    batch_size: int = 500
    concurrency: int = 3
    poll_interval_s: float = 5.0
    poll_min_interval_s: float = 0.05  # `off` mode's shortest poll
    fallback_poll_s: float = 1.0  # the poll while the wake-up lock's session is away
    publish_budget_s: float = 15.0  # relay/deadlines.py
    retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(max_attempts=10, base_s=1.0, max_s=300.0)
    )
    db_retry_max_s: float = 30.0
    ordering_block_on_dead: bool = False
    batch_max_bytes: int = 24 * 1024 * 1024


class Worker:
    """Drains due rows with `concurrency` batches in flight; sleeps until woken or due."""

    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        config: WorkerConfig,
        *,
        metrics: BatchObserver | None = None,
        lock: WakeupLock | None = None,
        doorbell: Doorbell | None = None,
        db_supervisor: Supervisor | None = None,
        tracing: Tracing | None = None,
        express: ExpressLane | None = None,
    ) -> None:
        self.store = store
        self.express = express
        self.publisher = publisher
        self.config = config
        self.metrics: BatchObserver = metrics or NoMetrics()
        self.claimed_total = 0
        doorbell = doorbell or Doorbell()
        self._wake = doorbell.event
        # How the loop sleeps between sweeps, and with the wake-up lock (None: producers
        # always notify): relay/loop/sleep.py.
        self.sleeper = Sleeper(doorbell, lock, store.seconds_until_next_due, SleepTimes(
            config.poll_interval_s, config.poll_min_interval_s,
            min(config.fallback_poll_s, config.poll_interval_s)))
        self._stopping = asyncio.Event()
        # The pool's connection state (relay/app.py passes the one among the process's
        # supervisors, which /healthz shows).
        self.db_supervisor = db_supervisor or Supervisor(
            "database", backoff=Backoff(0.2, config.db_retry_max_s), stopping=self._stopping)
        self.published_total = 0
        self._last_had_keys = False
        self._last_more_due = False
        self.last_loop_at = time.monotonic()
        self.tracing: Tracing = tracing or NoTracing()
        self._trace = NO_SWEEP  # the current wake-up's trace (relay/tracing)
        # Bytes per claim, shared by the lanes (they share the broker link) and kept across
        # drains, so a slow link is not met with a full batch again at every wake-up.
        self._bytes = LaneBytes(config.batch_max_bytes, config.publish_budget_s)

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
            self.sleeper.sweep_started()
            await self._sweep()
            self.sleeper.sweep_ended()

    async def _sleep(self) -> None:
        """Wait for the next sweep (relay/loop/sleep.py). An unexpected error there (a bug, a
        driver surprise) is logged and the worker polls once at the fallback interval: an idle
        relay's wake-up path must not end the relay, which would leave every row to wait for
        a restart."""
        try:
            await self.sleeper.sleep(self.claimed_total, self._sweep)
        except Exception as exc:
            log.error("sleep_failed", error=repr(exc), exc_info=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.fallback_poll_s):
                    await self._wake.wait()

    async def _sweep(self) -> None:
        """Drain once; on a failure back off (the database Supervisor) and ask for another.

        One attempt per sweep, so the loop keeps ticking (liveness) through a long outage.
        """
        db = self.db_supervisor
        self._trace = self.tracing.sweep()
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
        finally:
            self._trace.end()
            self._trace = NO_SWEEP
        await db.pause()
        self._wake.set()

    async def drain(self) -> None:
        """One batch; if it came back full, `concurrency` lanes until none finds a full batch
        of due rows."""
        # A trickle fits one batch: claim it alone rather than with `concurrency` claims, two
        # of which would come back empty (this matters when sweeps come every few ms). A
        # NOTIFY that came meanwhile leaves the doorbell rung: the loop sweeps again at once,
        # with one claim again; only a full batch says a backlog needs every lane.
        if self.publisher.ready:
            claimed = await self.run_batch()
            if self._short(claimed):
                return
        # A lane that fails (its database connection dropped) must not cancel the others while
        # they send: their batches may already be acked by the broker, and rolling them back
        # would send them again. The others finish the batch they send, claim no more, and the
        # first failure is raised once they have. A lane still claiming (waiting for a pooled
        # connection, a new connection's checks, its claim's statement) holds nothing the
        # broker has: it is cancelled (on a silent server it would wait out a command timeout
        # or two, and the outage's notice with it).
        failed = asyncio.Event()
        stages = [Stage() for _ in range(self.config.concurrency)]
        lanes = [asyncio.ensure_future(self._lane(failed, stage)) for stage in stages]
        abandon = asyncio.ensure_future(_cancel_claiming(failed, lanes, stages))
        # Beside the lanes, for as long as they run: rows that newer transactions commit
        # meanwhile go at once (relay/loop/express.py).
        drained = asyncio.Event()
        express = [] if self.express is None or not self._runs_express() else [
            asyncio.ensure_future(self.express.run_until(drained, self._express_batch))]
        try:
            outcomes = await asyncio.gather(*lanes, return_exceptions=True)
            drained.set()
            outcomes += await asyncio.gather(*express, return_exceptions=True)
        except asyncio.CancelledError:
            for lane in lanes + express:
                lane.cancel()
            await asyncio.gather(*lanes, *express, return_exceptions=True)
            raise
        finally:
            abandon.cancel()
        for outcome in outcomes:
            # A lane cancelled while it claimed: the failure that made it so comes from another.
            if isinstance(outcome, BaseException) and not isinstance(outcome,
                                                                     asyncio.CancelledError):
                raise outcome

    def _runs_express(self) -> bool:
        """One relay of a table runs the express lane while they drain: the sleeper
        (relay/pg/election.py). Its looks cost the server the same with 1 or N relays, and the
        live rows it claims go as fast; a waiter's fair rounds still take them when the sleeper
        does not. Every relay runs it while the role is undecided."""
        lock = self.sleeper.lock
        return lock is None or lock.state().role != "waiter"

    async def _lane(self, failed: asyncio.Event, stage: Stage) -> None:
        try:
            await self._lane_batches(failed, stage)
        except Exception:
            failed.set()
            raise

    async def _lane_batches(self, failed: asyncio.Event, stage: Stage) -> None:
        while not self.stopping and not failed.is_set():
            if not self.publisher.ready:
                # Hand the sleeper role to a replica that can publish meanwhile.
                await self.sleeper.step_down()
                await self._wait_broker()
                if self.stopping:
                    return
                if not self.publisher.ready:
                    # The wait ended without a connection (a reconnect attempt raised, or the
                    # broker dropped it again at once): claim nothing while it is away.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.2):
                            await self._stopping.wait()
                    continue
            claimed = await self.run_batch(stage)
            # A keyed claim is also bounded by the keys per batch, so a short batch with keyed
            # rows does not mean the backlog is empty: only an empty claim says that.
            if self._short(claimed):
                if self._wake.is_set() and not self.stopping:
                    # Rows were committed while this batch was in flight: claim them now
                    # instead of waiting for the other lanes to finish (steady-load latency).
                    # Cleared before the claim, so a commit racing it wakes us again.
                    self._wake.clear()
                    continue
                return

    def _short(self, claimed: int) -> bool:
        """The last batch came back short: the backlog is drained for now. A keyed claim is
        also bounded by the keys per batch, so a batch cut by it says nothing about the
        backlog: only an empty claim does then; a claim that stopped at its own bound (bytes,
        the single-active walk) says more may be due, even when it took nothing."""
        if claimed >= self.config.batch_size or self._last_more_due:
            return False
        return not (claimed and self._last_had_keys)

    async def _wait_broker(self) -> None:
        ready = asyncio.ensure_future(self.publisher.wait_ready())
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({ready, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ready, stop):
                task.cancel()
            await asyncio.gather(ready, stop, return_exceptions=True)

    async def run_batch(self, stage: Stage | None = None) -> int:
        """Run one batch (relay/loop/batch.py) within the lanes' byte budget; return the
        number of rows claimed."""
        plan = replace(self._plan(self.config.batch_size), max_bytes=self._bytes.now)
        report = await run_batch(self.store, self.publisher, plan, self._trace, stage)
        self._bytes.after(report)
        # Read by _lane right after this returns (no await in between, so lanes cannot mix).
        self._last_more_due = report.more_due
        self._last_had_keys = any(r.ordering_key is not None for r in report.rows)
        return self._account(report)

    async def _express_batch(self, store: ExpressStore, publisher: Publisher,
                             stage: Stage) -> int:
        """One batch of the express lane: its own claim, publisher and size."""
        report = await run_batch(store, publisher,
                                 self._plan(min(EXPRESS_ROWS, self.config.batch_size)),
                                 self._trace, stage)
        return self._account(report)

    def _plan(self, batch_size: int) -> BatchPlan:
        cfg = self.config
        return BatchPlan(batch_size, cfg.publish_budget_s, cfg.retry, cfg.ordering_block_on_dead)

    def _account(self, report: BatchReport) -> int:
        """Counters, metrics and the log of a committed batch; the rows it claimed."""
        # A batch that reached its commit is proof the database works: under a steady backlog
        # a drain may never return, and the recovery must not wait for one that does.
        self.db_supervisor.ok()
        rows = report.rows
        self.claimed_total += len(rows)
        if not rows:
            return 0
        published = sum(1 for v in report.verdicts if v.kind is Kind.PUBLISHED)
        self.published_total += published
        self.metrics.observe_batch(rows, report.verdicts, publish_s=report.publish_s,
                                   batch_s=report.batch_s, confirmed_at=report.confirmed_at)
        if report.untouched_outside:
            # Left untouched for a later pass; make sure one happens once the broker is back.
            self._wake.set()
        log.debug("batch_settled", claimed=len(rows), published=published, held=report.held,
                  elapsed_ms=round(report.batch_s * 1000, 1))
        return len(rows)



async def _cancel_claiming(failed: asyncio.Event, lanes: Sequence[asyncio.Future[None]],
                           stages: Sequence[Stage]) -> None:
    """Once a lane failed, cancel every other lane that is not sending a batch."""
    await failed.wait()
    cancel_claiming(zip(lanes, stages, strict=True))
