"""Test helpers: real relay processes, database sessions, condition waits. The consumer, the
producer and the proxy are the kit's (tests/kit/)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

RELAY_BIN = str(Path(sys.executable).with_name("relay"))


def with_user(url: str, user: str, password: str | None = None) -> str:
    """The same DSN or AMQP URL with another user (and password)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    cred = user if password is None else f"{user}:{password}"
    return urlunsplit(parts._replace(netloc=f"{cred}@{host}"))


def with_database(dsn: str, database: str) -> str:
    """The same server DSN, pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool],
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll a condition (sync or async) until true; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


@dataclass
class Env:
    """Where one test's relay points: its database, broker, exchange and queue."""

    pg_dsn: str
    amqp_url: str
    exchange: str
    queue: str
    routing_key: str = "rk"

    def relay_env(self, **overrides: Any) -> dict[str, str]:
        """Environment for a `relay` subprocess."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(
            RELAY_PG_DSN=self.pg_dsn,
            RELAY_AMQP_URL=self.amqp_url,
            RELAY_POLL_INTERVAL_S="2",
            RELAY_LOG_FORMAT="json",
            RELAY_LOG_LEVEL="info",
        )
        env.update({f"RELAY_{k.upper()}": str(v) for k, v in overrides.items()})
        return env


class RelayProcess:
    """A real `relay run` subprocess; its output goes to a log file the test can read."""

    def __init__(self, env: dict[str, str], log_path: Path, command: str = "run") -> None:
        self.env = env
        self.log_path = log_path
        self.command = command
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        """Start the process (appending to its log)."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [RELAY_BIN, self.command], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """The process is running."""
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; return the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    async def stop(self, timeout_s: float = 30.0) -> int:
        """terminate() without blocking the event loop: a proxy the relay talks through, or a
        consumer, may run on the test's loop, and a blocked loop stalls the relay's last
        batch (its settle waits on the proxy) past the shutdown timeout."""
        return await asyncio.to_thread(self.terminate, timeout_s)

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        events = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events

    def log_text(self) -> str:
        """The whole log."""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, name: str, lines: int = 80) -> str:
        """The last `lines` lines of the log under a heading with `name` and the exit code, for
        a failed test's report."""
        tail = self.log_text().splitlines()[-lines:]
        code = None if self.proc is None else self.proc.returncode
        return "\n".join([f"--- {name} (exit code {code}), its last {len(tail)} log lines:",
                          *tail])


async def count_rows(dsn: str, table: str = "queue_message") -> int:
    """Rows left in a table."""
    return int(await pg_fetchval(dsn, f"SELECT count(*) FROM {table}"))


@asynccontextmanager
async def pg_session(dsn: str | None = None, **kwargs: Any) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own for several statements (a transaction, a session kept
    while the relay runs), closed when the block ends."""
    conn = await asyncpg.connect(dsn, **kwargs)
    try:
        yield conn
    finally:
        await conn.close()


# One statement on a connection of its own, for a test that reads or changes the database
# once (a session kept across statements, or a transaction: pg_session above).

async def pg_fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """Every row of one statement."""
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def pg_fetchrow(dsn: str, sql: str, *args: Any) -> asyncpg.Record | None:
    """The first row of one statement (None: no row)."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchrow(sql, *args)
    finally:
        await conn.close()


async def pg_fetchval(dsn: str, sql: str, *args: Any) -> Any:
    """The first column of the first row of one statement."""
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


async def pg_execute(dsn: str, sql: str, *args: Any) -> str:
    """Run one statement (or, without arguments, a script of several); its status."""
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.execute(sql, *args))
    finally:
        await conn.close()


async def dead_reasons(dsn: str, table: str = "queue_message_dead") -> dict[str, str]:
    """Dead letters by row id: their reason."""
    return {r["id"]: r["reason"]
            for r in await pg_fetch(dsn, f"SELECT id::text AS id, reason FROM {table}")}
