"""The single-active leader's session: while it lives and holds the table's leader lock, its
relay leads (relay/loop/leader.py decides what to do with that)."""

from __future__ import annotations

from typing import Any

from relay.pg.config import DatabaseConfig
from relay.pg.connection import (
    DB_ERRORS,
    close_quietly,
    connect,
    database_error,
    watch_session,
)


class LeaderLock:
    """A session-level advisory lock on a dedicated connection, keyed on the table's oid."""

    def __init__(self, db: DatabaseConfig) -> None:
        self._db = db
        self._q = db.queries
        self._conn: Any = None

    async def try_acquire(self) -> bool:
        """Take the lock if free (opening the session first if needed); whether this session
        holds it. DatabaseError (DatabaseUnavailable: retry) when the server does not answer."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self._db, "leader")
                await self._end_when_silent(self._conn)
            return bool(await self._conn.fetchval(self._q["leader_try_lock"]))
        except DB_ERRORS as exc:
            await self.close()
            raise database_error(exc, "taking the leader lock") from exc

    async def _end_when_silent(self, conn: Any) -> None:
        """Have the server end this session when the relay stops talking on it: a standby
        polls and a leader pings every poll interval, so a session silent for ten intervals
        (30 s at least) is a relay cut off behind a proxy that keeps the server's side of the
        connection open, where keepalives never reach the relay's host; the server keeps its
        lock for as long as the session lives. idle_session_timeout: PostgreSQL 14 and newer."""
        if conn.get_server_version() >= (14,):
            await conn.execute(f"SET idle_session_timeout = {self._db.leader_idle_session_ms}")

    async def wait_lost(self, interval_s: float) -> str:
        """Return once the lock's session is gone (and with it the lock): why."""
        return await watch_session(self._conn, self._q["ping"], interval_s=interval_s,
                                   timeout_s=max(interval_s, 2.0))

    async def close(self) -> None:
        """End the session, which releases the lock."""
        conn, self._conn = self._conn, None
        await close_quietly(conn)
