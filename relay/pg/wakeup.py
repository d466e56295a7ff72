"""Whether producers must notify: the relay's side of the conditional wake-up.

In `conditional` mode (docs/notify.md) the trigger notifies only when it cannot take the
table's wake-up lock L in shared mode, that is while some relay holds it (or waits for it) in
exclusive mode. A relay about to sleep takes L exclusively: the lock is granted only once every
producer that took it shared (those that saw no relay asleep and skipped the NOTIFY) has
committed or rolled back. Then one statement asks whether any row is due now (only then does
the relay sweep once more) and when the next delayed row falls due, and the relay sleeps
holding L. On waking it releases L, so producers stop notifying while it drains.

Only one relay per table sleeps that way, the *sleeper* (relay/pg/election.py elects it on
the same session). Every other replica sleeps on LISTEN alone: a producer either notified
(every replica wakes) or skipped the NOTIFY while the sleeper was awake, and the sleeper's
next sleep finds its row. So an idle replica that is not the sleeper runs no query but its
periodic sweep.

This module is the database's side only: the lock, the election and the check, reported as a
`LockState` (relay/interfaces.py). Whether to sleep, for how long, and what to do with rows the
check finds is the sleeper's decision (relay/loop/sleep.py).

The session is supervised like every other connection the relay keeps (relay/supervise.py:
one log line per outage, its state in /healthz as `wakeup`), but never waited on: while it is
down the worker polls, and the session is tried again once the backoff delay has passed.

A dead relay cannot suppress notifications: both locks live in its database session, which
ends with the process (or, for a host that vanished, when TCP keepalives give up on it).

Relays follow the mode installed on the table (`relay migrate`): the sleeper re-reads it
before every sleep, so a mode switched on a live table takes effect at the next wake-up,
which migrate triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.interfaces import LockState
from relay.pg.connection import DB_ERRORS
from relay.pg.election import SleeperElection
from relay.pg.queries import Queries
from relay.supervise import Backoff, Supervisor

log = structlog.get_logger("relay.pg.wakeup")

_ACQUIRE_ERRORS: tuple[type[BaseException], ...] = (*DB_ERRORS, asyncio.CancelledError)
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (DatabaseError, *DB_ERRORS)


class WakeupLockSession:
    """The wake-up lock of a real relay on its own session (a `WakeupLock`): follows the
    table's installed notify mode and, as the table's sleeper in conditional mode, holds the
    lock while the relay sleeps (see the module docstring)."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        queries: Queries,
        wake: Callable[[], None],
        *,
        supervisor: Supervisor | None = None,
        wait_slice_s: float = 0.01,
        long_wait_slice_s: float = 0.1,
        long_wait_after_s: float = 1.0,
    ) -> None:
        self._connect = connect
        self._q = queries
        self._wake = wake
        self.wait_slice_s = wait_slice_s
        self.long_wait_slice_s = long_wait_slice_s
        self.long_wait_after_s = long_wait_after_s
        self._acquire_started = 0.0
        self.mode: str | None = None  # None: unknown (no session, or not the sleeper)
        self.held = False
        self.election = SleeperElection(queries, on_elected=wake, on_wait_ended=self._reset)
        self._conn: asyncpg.Connection | None = None
        self._acquire: asyncio.Future[Any] | None = None
        self._release: asyncio.Future[None] | None = None
        # A failure anywhere in the wake-up path (a refused connection, a statement that
        # errors) waits before the next try: capped, jittered, reset by a statement that works.
        self.supervisor = supervisor or Supervisor("wakeup", backoff=Backoff(0.2, 5.0))
        self._retry_at = 0.0

    @property
    def role(self) -> str | None:
        """"sleeper", "waiter" or None (undecided, or no session)."""
        return self.election.role

    def state(self) -> LockState:
        """What is known now, without a statement."""
        return LockState(role=self.role, mode=self.mode, held=self.held,
                         pending=self._acquire is not None)

    async def prepare(self, woken: asyncio.Event, *, queue: bool) -> LockState:
        """As the sleeper: read the mode and take the lock in conditional mode (queueing for
        it a slice at a time, or with `queue` False only trying), then read whether rows are
        due and when the next delayed one is. As a waiter: nothing (one statement while the
        role is undecided).

        The lock waits for producers that skipped the NOTIFY; some may have committed
        already while others are still open. So the wait is cut into slices (10 ms, 100 ms
        once it lasts over 1 s) and the worker sweeps between them: a committed row never
        waits for a slower neighbour. The request stays queued meanwhile (producers see a
        waiter and notify), and the next call picks up where it left.
        """
        if self.held or woken.is_set():
            return self.state()
        conn = await self._connection()
        if conn is None or not await self._decide_role(conn):
            return self.state()
        if self._acquire is None and not queue:
            return await self._try_lock(conn)
        return await self._wait_lock(conn, woken)

    async def _wait_lock(self, conn: asyncpg.Connection, woken: asyncio.Event) -> LockState:
        """Queue for the lock (or go on waiting) for one slice; then check, once granted."""
        if self._acquire is None:
            self._acquire = asyncio.ensure_future(
                conn.fetchrow(self._q["wakeup_prepare_sleep"], timeout=None)
            )
            self._acquire_started = time.monotonic()
        waited_s = time.monotonic() - self._acquire_started
        slice_s = (
            self.wait_slice_s if waited_s < self.long_wait_after_s else self.long_wait_slice_s
        )
        task = self._acquire
        woke = asyncio.ensure_future(woken.wait())
        try:
            await asyncio.wait({task, woke}, timeout=slice_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woke.cancel()
        if self._acquire is not task:
            # The session ended during the slice (its termination callback dropped the
            # request with it): nothing to read; the worker polls until the session is back.
            return self.state()
        if not task.done():
            return self.state()  # pending: the worker sweeps, then comes back
        self._acquire = None
        try:
            row = task.result()
        except TimeoutError:
            # A producer transaction held the lock shared for longer than the command
            # timeout; start again on a fresh session (the old one may hold the lock).
            log.info("wakeup_lock_wait_timeout")
            self._reset()
            return self.state()
        except _ACQUIRE_ERRORS as exc:
            self._lost(f"preparing to sleep failed: {exc}")
            return self.state()
        self.mode, self.held = str(row["mode"]), bool(row["locked"])
        return await self._check(conn)

    async def _try_lock(self, conn: asyncpg.Connection) -> LockState:
        """Take the lock only if no producer holds it shared; the check follows only when it
        was taken (or the mode needs no lock)."""
        try:
            row = await conn.fetchrow(self._q["wakeup_try_sleep"])
        except DB_ERRORS as exc:
            self._lost(f"preparing to sleep failed: {exc}")
            return self.state()
        assert row is not None
        self.mode, self.held = str(row["mode"]), bool(row["locked"])
        if self.mode == "conditional" and not self.held:
            return self.state()
        return await self._check(conn)

    async def _check(self, conn: asyncpg.Connection) -> LockState:
        """Rows due now and the next due time, read right after the lock was granted."""
        try:
            # A new statement, so a snapshot taken after the lock was granted.
            check = await conn.fetchrow(self._q["wakeup_check"])
        except DB_ERRORS as exc:
            self._lost(f"preparing to sleep failed: {exc}")
            return self.state()
        assert check is not None
        self.supervisor.ok()  # the whole path works: the next failure backs off from the start
        next_due = check["next_due_s"]
        return LockState(role=self.role, mode=self.mode, held=self.held, checked=True,
                         due_now=bool(check["due_now"]),
                         next_due_s=None if next_due is None else max(float(next_due), 0.0))

    async def _decide_role(self, conn: asyncpg.Connection) -> bool:
        """Whether this relay is the table's sleeper (relay/pg/election.py)."""
        undecided = self.election.role is None
        try:
            sleeper = await self.election.decide(conn)
        except DB_ERRORS as exc:
            self._lost(f"taking the sleeper role failed: {exc}")
            return False
        if undecided:
            self.supervisor.ok()  # a waiter runs no other statement on this session
        return sleeper

    async def release(self) -> None:
        """Release the lock without waiting: holding it a little longer only costs a few
        NOTIFYs, while the worker's drain should not wait for a round trip."""
        if self.held:
            self.held = False
            self._release = asyncio.ensure_future(self._unlock())

    async def step_down(self) -> None:
        """This relay cannot publish (its broker connection is down): end the lock session,
        so that the sleeper role goes to a replica that can. Producers then see that replica
        asleep and notify, instead of skipping the NOTIFY for a relay that cannot act on it
        (the other replicas would only have seen new rows at their poll interval). The next
        prepare(), once the broker is back, joins again."""
        if self._conn is None and not self.election.waiting:
            return
        was_sleeper = self.role == "sleeper"
        self._reset()
        if was_sleeper:
            log.info("wakeup_role_released", reason="broker connection down")

    async def close(self) -> None:
        """Drop the connection (which releases the locks) and forget pending requests."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
        self.election.forget()
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
        """The dedicated wake-up lock connection (session-level locks), opened on demand."""
        if self._release is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._release
            self._release = None
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if time.monotonic() < self._retry_at:
            return None  # backing off after a failure: the worker polls meanwhile
        try:
            conn = await self._connect()
        except _CONNECT_ERRORS as exc:
            self._lost(str(exc))
            return None
        conn.add_termination_listener(self._on_terminated)
        self._conn = conn
        return conn

    def _on_terminated(self, conn: Any) -> None:
        if conn is self._conn:
            self._lost("connection closed")

    def _reset(self) -> bool:
        """Drop the session (and with it both locks); return whether this relay was the
        sleeper (so producers may have skipped the NOTIFY on its account)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
        # A lock request queued on that session went with it: left pending, it would fail
        # later and take the next session down with it.
        acquire, self._acquire = self._acquire, None
        if acquire is not None:
            acquire.cancel()
        was_sleeper = self.election.forget() or self.held
        self.held, self.mode = False, None
        return was_sleeper

    def _lost(self, error: str) -> None:
        """The locks are gone with the connection: producers may stop notifying, so the
        worker must sweep and poll until the session is back."""
        was_sleeper = self._reset()
        self.supervisor.failed(error)  # logged once per outage, and once on recovery
        self._retry_at = time.monotonic() + self.supervisor.next_delay_s()
        if was_sleeper:
            self._wake()
