"""The express lane: while a backlog drains, rows that newer transactions commit go at once.

The drain's lanes claim full batches, and each batch's fair round gives every one of the newest
transactions a share (docs/fairness.md); still, a row committed meanwhile waits for a lane to
finish its batch and then travels behind that batch's hundreds of messages on the shared
channel: tens of milliseconds. The express lane runs beside the lanes, only while they run. It
looks at the newest transaction every `poll_s` (one index entry), and when a newer one has
committed it claims the fair round alone, in small batches (up to `EXPRESS_IN_FLIGHT` at once),
publishing over a broker connection of its own where no bulk batch is in flight.

Its rows are claimed FOR UPDATE SKIP LOCKED like every other claim, so the lane and the drain's
lanes never take the same row; what the lane misses (a transaction that is not among the newest)
the drain's batches take.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from relay.errors import DatabaseError
from relay.interfaces import EXPRESS_IN_FLIGHT, ExpressStore, Publisher
from relay.loop.batch import Stage, cancel_claiming

log = structlog.get_logger("relay.loop.express")

# Rows of one express claim: LEAST(32, rows / 2) transactions, one row each (the fair round's
# share of a claim this size), so a burst of one-row transactions goes in one batch.
EXPRESS_ROWS = 64
# While the lane's broker connection is away (reconnecting), the lane waits this long before
# it looks again. A database failure ends the lane for the rest of the drain instead: its next
# look would go to a pooled connection likely as dead as the one that failed (a silent cut: a
# command timeout more), and the drain's end, which reports the outage, waits for the lane.
FAILURE_PAUSE_S = 1.0
_T = TypeVar("_T")

BatchRunner = Callable[[ExpressStore, Publisher, Stage], Awaitable[int]]


@dataclass
class ExpressLane:
    """The store and publisher of the express lane, and how often it looks."""

    store: ExpressStore
    publisher: Publisher
    poll_s: float = 0.002
    # The newest transaction a look saw, kept across drains: each look asks only for a newer
    # one, so it never walks the index entries of rows claimed since (while the xmin horizon
    # is pinned they stay in the index: a look walked every one, every few milliseconds).
    seen: int = 0
    # The relay's main broker connection: the lane reconnects its own once that one is back,
    # so a broker that is away or refuses logins (rotated credentials) sees the main
    # connection's backed-off attempts only, not a second series beside them.
    main: Publisher | None = None
    # The lane's reconnect after its broker connection was lost (see _reconnect).
    _reconnecting: asyncio.Future[None] | None = field(default=None, init=False, repr=False)

    async def run_until(self, done: asyncio.Event, run_batch: BatchRunner) -> None:
        """Look and claim until `done` is set; a batch in flight then finishes first.
        `run_batch(store, publisher, stage)` runs one batch and returns the rows it claimed.

        A batch that failed on the database ends the lane, and its error is raised once the
        bursts in flight finished: the drain reports it after its own lanes. It may have been
        the drain's last statement (the lanes done before a silent cut, live rows still
        coming): swallowed, the outage was noticed only at the next statement, a command
        timeout later."""
        try:
            await self._run(done, run_batch)
        finally:
            self.store.after = None

    async def _run(self, done: asyncio.Event, run_batch: BatchRunner) -> None:
        seen: int | None = None
        bursts: dict[asyncio.Future[None], Stage] = {}
        errors: list[DatabaseError] = []  # a burst's failure ends the lane
        try:
            while not done.is_set() and not errors:
                if not self.publisher.ready:
                    # The drain's own claims take every transaction meanwhile. A blocked
                    # connection (flow control) needs no reconnect: it is unblocked in place.
                    if not self.publisher.connected:
                        self._reconnect()
                    self.store.after, seen = None, None
                    await _pause(done, FAILURE_PAUSE_S)
                    continue
                try:
                    look = await _unless_done(
                        done, self.store.newest_transaction(self.seen if seen is None else seen))
                except DatabaseError as exc:
                    # The drain's own lanes report the outage (the database supervisor); the
                    # next drain starts the lane again.
                    log.info("express_lane_paused", error=str(exc))
                    self.seen = 0  # the next look may reach another server
                    return
                except _Done:
                    # The drain ended during the look (its lanes failed: they report why); a
                    # look claims nothing, so it is given up rather than waited for. On a
                    # silent cut it could wait out the command timeout twice (its query, then
                    # a new connection's check), and the outage was noticed only after it.
                    return
                # Only what commits from now on: the drain's lanes take what is there
                # already, and a bulk transaction's drained head is never walked here.
                newest = look.xact
                if seen is None:
                    seen = self.store.after = self.seen = newest or self.seen
                if newest is None or newest <= seen or len(bursts) >= EXPRESS_IN_FLIGHT:
                    await _pause(done, self.poll_s)
                    continue
                seen = self.seen = newest
                # Once this burst has claimed all it finds, every transaction up to here that
                # has ended is served: the lane's claims may start above it.
                served = min(newest, look.running_from - 1)
                stage = Stage()
                burst = asyncio.ensure_future(self._burst(
                    run_batch, served, stage, done=done, errors=errors))
                bursts[burst] = stage
                burst.add_done_callback(lambda b: bursts.pop(b, None))
        except asyncio.CancelledError:
            # A hard stop (the drain is cancelled): the lane's batches roll back with the
            # drain's own.
            for running in bursts:
                running.cancel()
            raise
        finally:
            # On the drain's end a batch that sends finishes: its rows may be acked already.
            # One still claiming is cancelled: it holds nothing the broker has, and on a
            # silent server it would wait out a command timeout or two (a new connection's
            # checks, its claim), and the drain's notice of the outage with it.
            cancel_claiming(list(bursts.items()))
            await asyncio.gather(*bursts, return_exceptions=True)
        if errors:
            raise errors[0]

    def _reconnect(self) -> None:
        """Reconnect the lane's own broker connection, in the background and across drains,
        once the main connection is back (`_back`; its supervisor, `broker-express`, backs off
        between attempts and logs the outage). Nothing else reconnects it: without this, one
        broker outage turned the lane off for the rest of the process's life. Not bound to the
        drain: a connect cancelled half-way (the drain ended) could leave it half open."""
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.ensure_future(self._back())
            self._reconnecting.add_done_callback(_reconnect_ended)

    async def _back(self) -> None:
        """Wait for the main connection (its reconnect: the lanes' wait shares it, no login
        of its own), then reconnect the lane's."""
        if self.main is not None:
            await self.main.wait_ready()
        await self.publisher.wait_ready()

    async def _burst(self, run_batch: BatchRunner, served: int, stage: Stage, *,
                     done: asyncio.Event, errors: list[DatabaseError]) -> None:
        """Claim and publish until a claim brings at most one transaction's row (a burst of
        commits may be more than one claim), or the broker is gone: a batch whose publisher
        lost its connection leaves its rows untouched at once, and a burst that went on would
        claim them again and again while the broker is away.

        A burst whose last claim found nothing left moves the lane's claim floor up to
        `served`: the newest transaction its look saw, or, if older, the one before the oldest
        still running then (one that commits later is never left below the floor). Each claim
        walks the (xact, seq) index from its end down to that floor, and while the xmin
        horizon is pinned the entries of every row the lane claimed stay there: from the
        drain's start, that walk grew with every live row. One that ends with a single row
        may leave more rows of that transaction: the floor stays, and later bursts take them."""
        try:
            claimed = 2
            while (not done.is_set() and self.publisher.ready
                   and (claimed := await run_batch(self.store, self.publisher, stage)) > 1):
                pass
            if claimed == 0 and self.store.after is not None:
                self.store.floor = max(self.store.floor or 0, served)
        except DatabaseError as exc:
            log.info("express_lane_paused", error=str(exc))
            errors.append(exc)


def _reconnect_ended(task: asyncio.Future[None]) -> None:
    """A reconnect ends connected, or when the relay stops (the supervisor's Stopping), or on
    a fault retrying cannot fix, which the main connection reports too: the lane's next
    drain tries again."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.debug("express_reconnect_ended", error=repr(exc))


class _Done(Exception):
    """The drain ended while a look was under way."""


async def _unless_done(done: asyncio.Event, look: Awaitable[_T]) -> _T:
    """`look`'s result; _Done, the look cancelled, when `done` is set first."""
    task = asyncio.ensure_future(look)
    ended = asyncio.ensure_future(done.wait())
    try:
        await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, DatabaseError):
        await task
    raise _Done


async def _pause(done: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `done` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await done.wait()
