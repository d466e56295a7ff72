"""The dedicated LISTEN connection: any notification wakes the worker; reconnects forever."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.pg.store import DB_ERRORS

log = structlog.get_logger("relay.pg.listener")


class Listener:
    """Keeps one LISTEN connection open and calls `wake` on every notification and reconnect.

    Notifications sent while the connection was down are gone, so every (re)connect also
    wakes the worker for a sweep.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        wake: Callable[[], None],
        *,
        ping_sql: str = "SELECT 1",
        check_interval_s: float = 5.0,
        reconnect_max_s: float = 30.0,
    ) -> None:
        self._connect = connect
        self.channel = channel
        self._wake = wake
        self._ping_sql = ping_sql
        self.check_interval_s = check_interval_s
        self.reconnect_max_s = reconnect_max_s
        self.connected = False
        self._conn: asyncpg.Connection | None = None

    def _on_notify(self, *_: Any) -> None:
        self._wake()

    async def run(self) -> None:
        """Listen until cancelled; reconnect with capped backoff and jitter, logging once."""
        delay = 0.2
        outage = False
        while True:
            try:
                conn = await self._connect()
                await conn.add_listener(self.channel, self._on_notify)
            except (DatabaseError, *DB_ERRORS) as exc:  # type: ignore[misc]
                self.connected = False
                if not outage:
                    log.warning("listen_connection_lost", error=str(exc))
                    outage = True
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self.reconnect_max_s)
                continue
            if outage:
                log.info("listen_connection_restored")
            outage, delay = False, 0.2
            self._conn, self.connected = conn, True
            self._wake()
            try:
                await self._watch(conn)
            finally:
                self.connected = False
                self._conn = None
                conn.terminate()
            log.warning("listen_connection_lost", error="connection closed")
            outage = True

    async def _watch(self, conn: asyncpg.Connection) -> None:
        """Return when the connection is gone: closed by the server, or not answering a ping."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        while not lost.is_set() and not conn.is_closed():
            try:
                await asyncio.wait_for(lost.wait(), timeout=self.check_interval_s)
            except TimeoutError:
                try:
                    await conn.fetchval(self._ping_sql, timeout=self.check_interval_s)
                except DB_ERRORS:
                    return

    async def close(self) -> None:
        """Drop the connection (run() is cancelled by the owner)."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            conn.terminate()
