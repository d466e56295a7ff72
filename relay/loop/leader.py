"""RELAY_MODE=single-active: one leader per outbox table, chosen by a session advisory lock.

The lock lives on a dedicated connection: while that connection lives, its relay leads. A
leader killed outright loses its connection, Postgres drops the lock, and the next standby poll
takes it. A leader whose lock connection breaks while the process lives stops publishing and
exits (LeadershipLost), so that its supervisor restarts it as a standby; batches of all relays
on the table also pass a transaction-level fence (query single_active_fence), so its last batch
cannot overlap the new leader's first.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from relay.errors import DatabaseError, RelayError
from relay.loop.worker import Worker
from relay.supervise import Stopping, Supervisor

log = structlog.get_logger("relay.loop.leader")

Connect = Callable[[], Awaitable[Any]]
_PG_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError)
_RETRY_ON = (DatabaseError, OSError, TimeoutError, *_PG_ERRORS)


class LeadershipLost(RelayError):
    """The leader's lock connection broke: this relay stopped publishing and exits."""


class Leadership:
    """Acquires and watches the leader lock on its own connection, under its Supervisor."""

    def __init__(self, connect: Connect, lock_sql: str, ping_sql: str, *,
                 poll_interval_s: float, supervisor: Supervisor | None = None) -> None:
        self._connect = connect
        self._lock_sql = lock_sql
        self._ping_sql = ping_sql
        self.poll_interval_s = poll_interval_s
        self.supervisor = supervisor or Supervisor("leader")
        self._conn: Any = None

    async def acquire(self, heartbeat: Callable[[], None] = lambda: None) -> None:
        """Return once this relay holds the leader lock (stand by, polling, until then).

        `heartbeat` is called on every poll: a standby is alive, and liveness probes must say so.
        Raises Stopping when the relay stops first.
        """
        standby_logged = False
        while True:
            heartbeat()
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await self._connect()
                got = await self._conn.fetchval(self._lock_sql)
            except _RETRY_ON as exc:
                self.supervisor.failed(exc)
                await self._drop()
                if not await self.supervisor.pause():
                    raise Stopping("leader: stopping") from None
                continue
            self.supervisor.ok()
            if got:
                log.info("leader_elected")
                return
            if not standby_logged:
                log.info("standing_by", poll_interval_s=self.poll_interval_s)
                standby_logged = True
            interval = random.uniform(self.poll_interval_s * 0.8, self.poll_interval_s)
            if not await self.supervisor.sleep(interval):
                raise Stopping("leader: stopping")

    async def watch(self) -> None:
        """Raise LeadershipLost as soon as the lock connection stops answering."""
        while await self.supervisor.sleep(self.poll_interval_s):
            try:
                await asyncio.wait_for(self._conn.fetchval(self._ping_sql),
                                       timeout=max(self.poll_interval_s, 2.0))
            except (OSError, TimeoutError, *_PG_ERRORS) as exc:
                self.supervisor.lost(exc)
                raise LeadershipLost(f"leader lock connection lost: {exc}") from exc

    async def close(self) -> None:
        """Close the lock connection (which releases the lock)."""
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), timeout=5)


async def run_when_leader(worker: Worker, leadership: Leadership,
                          on_lost: Callable[[], None]) -> None:
    """Stand by until leader, then run the worker; on a lost lock call on_lost and raise."""
    def heartbeat() -> None:
        worker.last_loop_at = time.monotonic()

    acquiring = asyncio.ensure_future(leadership.acquire(heartbeat))
    try:
        while not acquiring.done():
            await asyncio.wait({acquiring}, timeout=0.1)
            if worker.stopping:
                return
        with contextlib.suppress(Stopping):
            acquiring.result()
        if worker.stopping or leadership.supervisor.stopping.is_set():
            return
    finally:
        acquiring.cancel()
        await asyncio.gather(acquiring, return_exceptions=True)
    watching = asyncio.ensure_future(leadership.watch())
    running = asyncio.ensure_future(worker.run())
    try:
        await asyncio.wait({watching, running}, return_when=asyncio.FIRST_COMPLETED)
        if watching.done():
            log.error("leadership_lost", error=str(watching.exception()))
            worker.stop()
            on_lost()  # roll back in-flight batches: this relay may no longer commit them
            watching.result()
        await running
    finally:
        for task in (watching, running):
            task.cancel()
        await asyncio.gather(watching, running, return_exceptions=True)
