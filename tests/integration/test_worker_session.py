"""What the worker's sessions ask of the server: commits that do not wait for their WAL flush
(a lost settle brings rows back, it never drops one), unless the DSN says otherwise."""

from __future__ import annotations

from urllib.parse import quote

from relay.pg.connection import connect
from relay.pg.store import Outbox
from relay.settings import Settings


async def _worker_setting(dsn: str, name: str) -> str:
    outbox = await Outbox.open(Settings(pg_dsn=dsn))
    try:
        async with outbox._pool.acquire() as conn:
            return str(await conn.fetchval(f"SHOW {name}"))
    finally:
        await outbox.close()


async def test_worker_sessions__commit_without_waiting_for_the_flush(db: str) -> None:
    assert await _worker_setting(db, "synchronous_commit") == "off"
    # Sessions that only wait on locks or LISTEN keep the server's default.
    listener = await connect(Settings(pg_dsn=db), "listener")
    try:
        assert await listener.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await listener.close()


async def test_worker_sessions__the_dsn_options_win(db: str) -> None:
    options = quote("-c synchronous_commit=on")
    dsn = db + ("&" if "?" in db else "?") + f"options={options}"
    assert await _worker_setting(dsn, "synchronous_commit") == "on"
