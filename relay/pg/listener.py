"""The dedicated LISTEN session: any notification wakes the worker; its Supervisor reconnects."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import structlog

from relay.errors import DatabaseError
from relay.pg.connection import DB_ERRORS, watch_session
from relay.supervise import Stopping, Supervisor

log = structlog.get_logger("relay.pg.listener")

# A connection that fails, or a LISTEN a standby refuses ("cannot execute LISTEN during
# recovery"): both mean "no usable primary now".
_RETRY_ON: tuple[type[BaseException], ...] = (DatabaseError, *DB_ERRORS)


class Listener:
    """Keeps one LISTEN session open and calls `wake` on every notification and reconnect.

    Notifications sent while the session was down are gone, so every (re)connect also wakes
    the worker for a sweep. After a failover the connect function finds the new primary.
    Every (re)connect also calls `on_up`: the server answers again, so the worker's pool need
    not sit out the rest of its backoff delay.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[asyncpg.Connection]],
        channel: str,
        wake: Callable[[], None],
        *,
        supervisor: Supervisor | None = None,
        ping_sql: str = "SELECT 1",
        check_interval_s: float = 5.0,
        on_up: Callable[[], None] | None = None,
    ) -> None:
        self._connect = connect
        self.channel = channel
        self._wake = wake
        self.supervisor = supervisor or Supervisor("listener")
        self._ping_sql = ping_sql
        self.check_interval_s = check_interval_s
        self._conn: asyncpg.Connection | None = None
        self._on_up = on_up

    @property
    def connected(self) -> bool:
        """The LISTEN session is up."""
        return self.supervisor.up

    def _on_notify(self, *_: Any) -> None:
        self._wake()

    async def _open(self) -> asyncpg.Connection:
        conn = await self._connect()
        try:
            await conn.add_listener(self.channel, self._on_notify)
        except BaseException:
            conn.terminate()
            raise
        return conn

    async def run(self) -> None:
        """Listen until the relay stops (or the task is cancelled); reconnect when lost."""
        while True:
            try:
                conn = await self.supervisor.establish(self._open, retry_on=_RETRY_ON)
            except Stopping:
                return
            self._conn = conn
            if self._on_up is not None:
                self._on_up()
            self._wake()
            try:
                reason = await self._watch(conn)
            finally:
                self._conn = None
                conn.terminate()
            self.supervisor.lost(reason)

    async def _watch(self, conn: asyncpg.Connection) -> str:
        """Return why the session is gone: closed by the server, or not answering a ping."""
        return await watch_session(conn, self._ping_sql, interval_s=self.check_interval_s,
                                   timeout_s=self.check_interval_s)

    async def close(self) -> None:
        """Drop the connection (run() is cancelled by the owner)."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            conn.terminate()
