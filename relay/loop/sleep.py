"""How an idle relay sleeps and wakes: every decision in one room.

The worker calls `Sleeper.sleep()` between sweeps. The sleeper decides whether to sleep at all
(a busy drain or a steady flow sweeps again at once), asks the database's side of the wake-up
(`WakeupLock`, relay/interfaces.py; relay/pg/wakeup.py) for the lock and the check, and from
what that reports decides: drain awake, sweep once holding the lock, or sleep, and for how long
(the poll interval, the next delayed row, the adaptive poll of `off` mode, a short poll while
the lock's session is away). docs/notify.md tells the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from relay.errors import DatabaseError
from relay.interfaces import LockState, WakeupLock


class Doorbell:
    """What wakes the worker: a NOTIFY (relay/pg/listener.py), a reconnect, the wake-up lock's
    role change. Made before the worker and handed to it and to whatever rings it, so that no
    part is wired into another after construction."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def ring(self) -> None:
        """Ask the worker for a sweep now."""
        self.event.set()


# When a relay sleeps at all: at a trickle it sleeps holding the wake-up lock and producers
# notify (a NOTIFY costs them nothing while few commit at once, and the relay wakes the instant
# a row commits instead of polling). Under a heavy flow a NOTIFY would serialise the producers'
# commits, so while each wake-up's drain brings back at least this many rows the relay sweeps
# again at once, holding no lock, and producers skip the NOTIFY. At 1,000 commits/s a drain
# brings a few rows; with 8 producers committing as fast as they can, tens.
BUSY_DRAIN_ROWS = 16


def keep_sweeping(rows_this_wakeup: int) -> bool:
    """Sweep again at once instead of going to sleep."""
    return rows_this_wakeup >= BUSY_DRAIN_ROWS


# A steady flow of a few rows per wake-up (1,000 commits/s brings 1-3 rows to a batch of a
# couple of milliseconds): when a wake-up came this soon after the last sweep ended and found
# rows, more have most likely been committed while its batch ran, so the relay sweeps again
# at once; the sweep's own claim is the check, instead of the lock's two statements before a
# sleep that would last a fraction of a millisecond. The first sweep that finds nothing goes
# to sleep as usual. At a trickle the gap is the sleep itself, far longer than this, and
# nothing changes.
FLOW_GAP_S = 0.005


def in_flow(rows_this_wakeup: int, gap_s: float) -> bool:
    """Rows come as a flow: this wake-up found rows and came soon after the last sweep."""
    return rows_this_wakeup > 0 and gap_s < FLOW_GAP_S


class AdaptivePoll:
    """Polling interval of `off` mode: the minimum while sweeps find rows, doubling up to the
    maximum while they find none."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s = min(min_s, max_s)
        self.max_s = max_s
        self.current_s = self.min_s

    def next_s(self, found_rows: bool) -> float:
        """The interval before the next sweep, given what the last one found."""
        if found_rows:
            self.current_s = self.min_s
        else:
            self.current_s = min(self.current_s * 2, self.max_s)
        return self.current_s


@dataclass(frozen=True, slots=True)
class SleepTimes:
    """The sleeper's clock settings: the poll interval (the longest sleep), the shortest poll
    of `off` mode, and the poll while the sleeper has no lock session."""

    poll_interval_s: float
    poll_min_interval_s: float
    fallback_poll_s: float


class Sleeper:
    """The worker's sleep between sweeps; see the module docstring.

    `lock` None: producers always notify, so a sleep needs nothing but the doorbell and the
    next due time. `next_due` reads the next delayed row's due time from the store when the
    lock did not.
    """

    def __init__(self, doorbell: Doorbell, lock: WakeupLock | None,
                 next_due: Callable[[], Awaitable[float | None]], times: SleepTimes) -> None:
        self._wake = doorbell.event
        self.lock = lock
        self._next_due = next_due
        self.times = times
        self._poll = AdaptivePoll(times.poll_min_interval_s, times.poll_interval_s)
        self._claimed_at_sleep = 0
        self._drained_awake = False  # the last check's rows were drained awake
        # From the end of one sweep to the start of the next (the flow rule).
        self._swept_at = 0.0
        self._gap_s = float("inf")

    def sweep_started(self) -> None:
        """A wake-up's sweep begins (the flow rule measures the gap since the last one)."""
        self._gap_s = time.monotonic() - self._swept_at

    def sweep_ended(self) -> None:
        """A wake-up's sweep is over."""
        self._swept_at = time.monotonic()

    async def sleep(self, claimed_total: int, sweep: Callable[[], Awaitable[None]]) -> None:
        """Return when the worker should sweep: at once after a busy drain or within a flow,
        else when woken, at the poll interval or when the next delayed row falls due."""
        found = claimed_total - self._claimed_at_sleep
        self._claimed_at_sleep = claimed_total
        if self._wake.is_set() or keep_sweeping(found) or in_flow(found, self._gap_s):
            await self._release()
            return
        state = (await self.lock.prepare(self._wake, queue=not self._try_first(found))
                 if self.lock is not None else LockState())
        due_known, next_due_s = self._due_time(state)
        if state.checked:
            due = state.held and state.due_now
            # Rows due that no NOTIFY will announce (their producers skipped it): drain them
            # awake, lock released, then come back to check again; unless the last such drain
            # found none (another relay holds them, or their key's head is not due): then one
            # sweep holding the lock, and sleep.
            awake = due and (found > 0 or not self._drained_awake)
            self._drained_awake = awake
            if awake:
                await self._release()
                return
            if due:
                await sweep()
                due_known = False  # the sweep may have rescheduled rows: read it again
        elif self._producers_hold_the_lock(state):
            # After a drain that found rows, producers are likely mid-transaction: stay awake
            # and sweep again while they keep coming; they skip the NOTIFY meanwhile.
            await self._release()
            return
        timeout = await self._budget_s(due_known, next_due_s)
        cap = self._cap_s(found)
        if cap is not None:
            timeout = min(timeout, cap)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        await self._release()

    async def step_down(self) -> None:
        """This relay cannot publish now: give the sleeper role to a replica that can."""
        if self.lock is not None:
            await self.lock.step_down()

    def _try_first(self, found: int) -> bool:
        """After a drain that found rows, take the lock only if no producer holds it shared: a
        queued request would make every producer that arrives meanwhile notify. The first
        drain that finds nothing queues the request."""
        assert self.lock is not None
        state = self.lock.state()
        return found > 0 and not state.pending and state.mode == "conditional"

    @staticmethod
    def _producers_hold_the_lock(state: LockState) -> bool:
        return (state.role == "sleeper" and state.mode == "conditional" and not state.held
                and not state.pending)

    @staticmethod
    def _due_time(state: LockState) -> tuple[bool, float | None]:
        """Whether the next due time is known without asking the store, and what it is: read
        by the check, or not needed (a waiter sleeps on LISTEN: the sleeper minds delayed rows;
        a pending lock sweeps again at once)."""
        if state.checked:
            return True, state.next_due_s
        return state.pending or state.role == "waiter", None

    async def _budget_s(self, due_known: bool, next_due_s: float | None) -> float:
        """The poll interval, or less when a delayed row falls due sooner."""
        if self._wake.is_set():
            return 0.0
        due = next_due_s
        if not due_known:
            try:
                due = await self._next_due()
            except DatabaseError:
                return self.times.poll_interval_s
        if due is None:
            return self.times.poll_interval_s
        return min(self.times.poll_interval_s, due + 0.005)

    def _cap_s(self, found: int) -> float | None:
        """No sleep while the lock is pending (sweep now, then wait another slice); the
        adaptive poll in `off` mode; a short poll while the sleeper has no lock session."""
        if self.lock is None:
            return None
        state = self.lock.state()
        if state.pending:
            return 0.0
        if state.role == "waiter":
            return None
        if state.mode == "off":
            return self._poll.next_s(found > 0)
        if state.mode is None:
            return self.times.fallback_poll_s
        return None

    async def _release(self) -> None:
        if self.lock is not None:
            await self.lock.release()
