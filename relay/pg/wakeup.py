"""Whether producers must notify: the relay's side of the conditional wake-up.

In `conditional` mode (docs/notify.md) the trigger notifies only when it cannot take the
table's wake-up lock in shared mode, that is while some relay holds it (or waits for it) in
exclusive mode. A relay takes it exclusively when it is about to sleep: the lock is granted
only once every producer that took it shared (those that saw no relay asleep and skipped the
NOTIFY) has committed or rolled back; the relay then sweeps once more and sleeps holding it.
On waking it releases the lock, so producers stop notifying while it drains; and while its
sweeps keep finding rows it does not go to sleep at all but sweeps again every few
milliseconds, so a steady flow of producers never notifies.

A dead relay cannot suppress notifications: a lock lives in its database session, which ends
with the process (or, for a host that vanished, when TCP keepalives give up on it).

Relays follow the mode installed on the table (`relay migrate`), re-read before every sleep,
so a mode switched on a live table takes effect at the next wake-up, which migrate triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.pg.queries import Queries
from relay.pg.store import DB_ERRORS

log = structlog.get_logger("relay.pg.wakeup")

_ACQUIRE_ERRORS: tuple[type[BaseException], ...] = (*DB_ERRORS, asyncio.CancelledError)
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (DatabaseError, *DB_ERRORS)


class WakeupGate(Protocol):
    """What the worker calls around its sleep."""

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> bool:
        """Register as asleep (found_rows: the sweeps since the last sleep found rows);
        True when a final sweep must run before sleeping."""

    async def mark_awake(self) -> None:
        """Register as awake (producers stop notifying)."""

    def sleep_cap_s(self) -> float | None:
        """Upper bound of the coming sleep, or None for the worker's own (poll interval)."""

    async def close(self) -> None:
        """Release everything (stop)."""


class AlwaysNotified:
    """The no-op gate: producers always notify, so the worker needs nothing around its sleep."""

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> bool:
        """Nothing to register."""
        return False

    async def mark_awake(self) -> None:
        """Nothing to register."""

    def sleep_cap_s(self) -> float | None:
        """The worker's poll interval applies."""
        return None

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


class LockGate:
    """The gate of a real relay: follows the table's installed notify mode and, in
    conditional mode, holds the wake-up lock while asleep (see the module docstring)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        queries: Queries,
        wake: Callable[[], None],
        *,
        poll: AdaptivePoll,
        fallback_poll_s: float = 1.0,
        awake_poll_s: float = 0.002,
        wait_slice_s: float = 0.01,
        long_wait_slice_s: float = 0.1,
        long_wait_after_s: float = 1.0,
    ) -> None:
        self._connect = connect
        self._q = queries
        self._wake = wake
        self._poll = poll
        self.fallback_poll_s = fallback_poll_s
        self.awake_poll_s = awake_poll_s
        self._lingering = False
        self._found_rows = False
        self.wait_slice_s = wait_slice_s
        self.long_wait_slice_s = long_wait_slice_s
        self.long_wait_after_s = long_wait_after_s
        self._acquire_started = 0.0
        self.mode: str | None = None  # None: unknown (no gate connection)
        self.held = False
        self._conn: asyncpg.Connection | None = None
        self._acquire: asyncio.Future[Any] | None = None
        self._release: asyncio.Future[None] | None = None
        self._outage = False

    async def prepare_sleep(self, woken: asyncio.Event, found_rows: bool) -> bool:
        """Read the mode and, in conditional mode, take the lock; give up when woken or after
        a short slice of waiting.

        The lock waits for producers that skipped the NOTIFY; some may have committed
        already while others are still open. So the wait is cut into slices (10 ms, 100 ms
        once it lasts over 1 s) and the worker sweeps between them: a committed row never
        waits for a slower neighbour. The request stays queued meanwhile (producers see a
        waiter and notify), and the next prepare_sleep picks up where it left.

        While sweeps keep finding rows the relay does not sleep at all in conditional mode:
        it sweeps again after `awake_poll_s`, so under a steady flow producers never notify.
        """
        self._found_rows = found_rows
        self._lingering = (
            found_rows and self.mode == "conditional" and self._acquire is None
        )
        if self.held or self._lingering or woken.is_set():
            return False
        if self._acquire is None:
            conn = await self._connection()
            if conn is None:
                return False
            self._acquire = asyncio.ensure_future(
                conn.fetchrow(self._q["wakeup_prepare_sleep"], timeout=None)
            )
            self._acquire_started = time.monotonic()
        waited_s = time.monotonic() - self._acquire_started
        slice_s = (
            self.wait_slice_s if waited_s < self.long_wait_after_s else self.long_wait_slice_s
        )
        woke = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait(
                {self._acquire, woke}, timeout=slice_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            woke.cancel()
        if not self._acquire.done():
            return False
        task, self._acquire = self._acquire, None
        try:
            row = task.result()
        except TimeoutError:
            # A producer transaction held the lock shared for longer than the command
            # timeout; start again on a fresh session (the old one may hold the lock).
            log.info("wakeup_lock_wait_timeout")
            self._reset()
            return False
        except _ACQUIRE_ERRORS as exc:
            self._lost(f"preparing to sleep failed: {exc}")
            return False
        self.mode, self.held = str(row["mode"]), bool(row["locked"])
        return self.held

    async def mark_awake(self) -> None:
        """Release the lock without waiting: holding it a little longer only costs a few
        NOTIFYs, while the worker's drain should not wait for a round trip."""
        if self.held:
            self.held = False
            self._release = asyncio.ensure_future(self._unlock())

    def sleep_cap_s(self) -> float | None:
        """No sleep while the lock is pending (prepare_sleep waited a slice: sweep now); a
        short one while lingering awake; adaptive polling in `off` mode; short polling
        while the mode is unknown."""
        if self._acquire is not None:
            return 0.0
        if self._lingering:
            return self.awake_poll_s
        if self.mode == "off":
            return self._poll.next_s(self._found_rows)
        if self.mode is None:
            return self.fallback_poll_s
        return None

    async def close(self) -> None:
        """Drop the connection (which releases the lock) and forget pending requests."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
        pending = [t for t in (self._acquire, self._release) if t is not None]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._acquire = self._release = None
        self.held = False

    async def _unlock(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            await conn.fetchval(self._q["wakeup_release"])
        except DB_ERRORS as exc:
            self._lost(f"releasing the wake-up lock failed: {exc}")

    async def _connection(self) -> asyncpg.Connection | None:
        """The dedicated gate connection (session-level lock), opened on demand."""
        if self._release is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._release
            self._release = None
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        try:
            conn = await self._connect()
        except _CONNECT_ERRORS as exc:
            self._lost(str(exc))
            return None
        conn.add_termination_listener(self._on_terminated)
        self._conn = conn
        if self._outage:
            log.info("wakeup_connection_restored")
            self._outage = False
        return conn

    def _on_terminated(self, conn: Any) -> None:
        if conn is self._conn:
            self._lost("connection closed")

    def _reset(self) -> bool:
        """Drop the session (and with it the lock); return whether the lock was held."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
        was_held, self.held, self.mode = self.held, False, None
        return was_held

    def _lost(self, error: str) -> None:
        """The lock is gone with the connection: producers may stop notifying, so the
        worker must sweep and poll until the lock is held again."""
        was_held = self._reset()
        if not self._outage:
            log.warning("wakeup_connection_lost", error=error)
            self._outage = True
        if was_held:
            self._wake()
