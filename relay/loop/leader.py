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
from collections.abc import Callable
from typing import Protocol

import structlog

from relay.errors import DatabaseError, RelayError
from relay.loop.worker import Worker
from relay.supervise import Stopping, Supervisor

log = structlog.get_logger("relay.loop.leader")


class Lock(Protocol):
    """The leader lock's session (relay/pg/leaderlock.py); failures raise DatabaseError."""

    async def try_acquire(self) -> bool: ...

    async def wait_lost(self, interval_s: float) -> str: ...

    async def close(self) -> None: ...


class LeadershipLost(RelayError):
    """The leader's lock connection broke: this relay stopped publishing and exits."""


class Leadership:
    """Acquires and watches the leader lock on its own connection, under its Supervisor."""

    def __init__(self, lock: Lock, *, poll_interval_s: float,
                 supervisor: Supervisor | None = None) -> None:
        self._lock = lock
        self.poll_interval_s = poll_interval_s
        self.supervisor = supervisor or Supervisor("leader")

    async def acquire(self, heartbeat: Callable[[], None] = lambda: None) -> None:
        """Return once this relay holds the leader lock (stand by, polling, until then).

        `heartbeat` is called on every poll: a standby is alive, and liveness probes must say so.
        Raises Stopping when the relay stops first.
        """
        standby_logged = False
        while True:
            heartbeat()
            try:
                got = await self._lock.try_acquire()
            except DatabaseError as exc:
                self.supervisor.failed(exc)
                await self._lock.close()
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
        """Raise LeadershipLost as soon as the lock connection is gone or stops answering."""
        reason = await self._lock.wait_lost(self.poll_interval_s)
        self.supervisor.lost(reason)
        raise LeadershipLost(f"leader lock connection lost: {reason}")

    async def close(self) -> None:
        """Close the lock connection (which releases the lock)."""
        await self._lock.close()


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
