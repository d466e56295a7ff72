"""Which relay of a table is its *sleeper*: the one that sleeps holding the wake-up lock
(relay/pg/wakeup.py), elected by a second advisory lock, the role lock R.

The sleeper holds R for the life of its wake-up lock session. Every other replica is a
*waiter*: its wake-up lock session queues a request for R (a lock request costs nothing while it
waits) and sleeps on LISTEN alone. When the sleeper's session ends (stop, crash, lost network)
a waiter is granted R and takes over. The election shares the wake-up lock's session on
purpose: the session that ends with a process releases both locks at once, so a dead relay can
neither keep the role nor keep producers from notifying.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

import asyncpg
import structlog

from relay.pg.queries import Queries

log = structlog.get_logger("relay.pg.election")

Role = Literal["sleeper", "waiter"]

# A waiter renews its request for the role lock this often (a fresh session each time).
ROLE_WAIT_S = 3600.0
# And asks again on its session this often: a statement waiting for a lock holds a snapshot,
# which keeps VACUUM from removing rows deleted after it began and makes every CREATE INDEX
# CONCURRENTLY in the database wait for it to end.
ROLE_SLICE_S = 10.0


class SleeperElection:
    """The role of this relay on the wake-up lock's session: None until decided, then sleeper or
    waiter. Driver errors of `decide` are the caller's (that session is then lost)."""

    def __init__(
        self,
        queries: Queries,
        *,
        on_elected: Callable[[], None],
        on_wait_ended: Callable[[], object],
        wait_s: float = ROLE_WAIT_S,
        slice_s: float = ROLE_SLICE_S,
    ) -> None:
        self._q = queries
        self._on_elected = on_elected  # a waiter became the sleeper: sweep now
        self._on_wait_ended = on_wait_ended  # the request ended without the role: new session
        self._wait_s = wait_s
        self._slice_s = slice_s
        self.role: Role | None = None
        self._waiting: asyncio.Future[Any] | None = None

    @property
    def waiting(self) -> bool:
        """A request for the role is queued on the session."""
        return self._waiting is not None

    async def decide(self, conn: asyncpg.Connection) -> bool:
        """Whether this relay is the sleeper; the first call on a session tries for the role
        and, when another relay has it, queues for it."""
        if self.role is None:
            if await conn.fetchval(self._q["wakeup_role_try"]):
                self.role = "sleeper"
            else:
                self.role = "waiter"
                self._waiting = asyncio.ensure_future(self._wait_for_role(conn))
                self._waiting.add_done_callback(self._granted)
        return self.role == "sleeper"

    async def _wait_for_role(self, conn: asyncpg.Connection) -> object:
        """Queue for the role lock a slice at a time, on the same session, until it is granted
        or `wait_s` has passed (then TimeoutError: a fresh session asks again)."""
        deadline = time.monotonic() + self._wait_s
        slice_ms = str(max(1, int(self._slice_s * 1000)))
        while True:
            try:
                # The client's timeout only backs up the server's lock_timeout.
                return await conn.fetchval(self._q["wakeup_role_wait"], slice_ms,
                                           timeout=self._slice_s + 60.0)
            except asyncpg.LockNotAvailableError as exc:
                if time.monotonic() >= deadline:
                    raise TimeoutError("the role lock stayed held: asking on a new session") \
                        from exc

    def forget(self) -> bool:
        """The session is gone (or given up): no role, no queued request. Returns whether
        this relay was the sleeper."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.cancel()
        was_sleeper = self.role == "sleeper"
        self.role = None
        return was_sleeper

    def _granted(self, task: asyncio.Future[Any]) -> None:
        if task is not self._waiting:
            return
        self._waiting = None
        if task.cancelled():
            return
        if task.exception() is not None:
            # Renewal after a long wait, or a lost session: a fresh session asks again.
            self._on_wait_ended()
            return
        # The previous sleeper's session ended: producers may have skipped the NOTIFY
        # meanwhile, so sweep and go to sleep the sleeper's way.
        self.role = "sleeper"
        log.info("wakeup_sleeper_role_taken")
        self._on_elected()
