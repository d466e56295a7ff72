"""What the worker and a wake-up gate agree on around a sleep: the plan a gate hands back, the
protocol, the no-op gate, the adaptive poll of `off` mode, and the policy that decides whether
to sleep at all. relay/pg/wakeup.py implements the gate of a real relay on its session."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol


class Doorbell:
    """What wakes the worker: a NOTIFY (relay/pg/listener.py), a reconnect, the wake-up gate's
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
    """The sleep policy of every gate: sweep again at once instead of going to sleep."""
    return rows_this_wakeup >= BUSY_DRAIN_ROWS


# A steady flow of a few rows per wake-up (1,000 commits/s brings 1-3 rows to a batch of a
# couple of milliseconds): when a wake-up came this soon after the last sweep ended and found
# rows, more have most likely been committed while its batch ran, so the relay sweeps again
# at once; the sweep's own claim is the check, instead of the gate's two statements before a
# sleep that would last a fraction of a millisecond. The first sweep that finds nothing goes
# to sleep as usual. At a trickle the gap is the sleep itself, far longer than this, and
# nothing changes.
FLOW_GAP_S = 0.005


def in_flow(rows_this_wakeup: int, gap_s: float) -> bool:
    """Rows come as a flow: this wake-up found rows and came soon after the last sweep."""
    return rows_this_wakeup > 0 and gap_s < FLOW_GAP_S


@dataclass(frozen=True, slots=True)
class SleepPlan:
    """What the gate learned before a sleep.

    stay_awake: rows are due that no NOTIFY will announce (their producers skipped it):
    release the lock and drain them awake, then come back. sweep: rows are due but the last
    such drain found none (another relay holds them, or their key's head is not due): sweep
    once holding the lock, then sleep. due_known: next_due_s was read (None: no delayed row);
    when False the worker asks the store itself.
    """

    stay_awake: bool = False
    sweep: bool = False
    due_known: bool = False
    next_due_s: float | None = None


class WakeupGate(Protocol):
    """What the worker calls around its sleep."""

    def keep_sweeping(self, rows_this_wakeup: int) -> bool:
        """Sweep again at once instead of sleeping (the drain since the last sleep was busy)."""

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> SleepPlan:
        """Register as asleep (found_rows: the sweeps since the last sleep found rows)."""

    async def mark_awake(self) -> None:
        """Register as awake (producers stop notifying)."""

    def sleep_cap_s(self) -> float | None:
        """Upper bound of the coming sleep, or None for the worker's own (poll interval)."""

    async def step_down(self) -> None:
        """This relay cannot publish now: let a replica that can take the sleeper role."""

    async def close(self) -> None:
        """Release everything (stop)."""


class AlwaysNotified:
    """The no-op gate: producers always notify, so the worker needs nothing around its sleep."""

    def keep_sweeping(self, rows_this_wakeup: int) -> bool:
        """The common sleep policy."""
        return keep_sweeping(rows_this_wakeup)

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> SleepPlan:
        """Nothing to register; the worker reads the next due time itself."""
        return SleepPlan()

    async def mark_awake(self) -> None:
        """Nothing to register."""

    def sleep_cap_s(self) -> float | None:
        """The worker's poll interval applies."""
        return None

    async def step_down(self) -> None:
        """No role to give up."""

    async def close(self) -> None:
        """Nothing to release."""


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
