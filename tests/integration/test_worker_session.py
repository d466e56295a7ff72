"""What the worker's sessions ask of the server: commits that do not wait for their WAL flush
(a lost settle brings rows back, it never drops one), unless the DSN says otherwise; every
statement of a claim's transaction prepared before it begins; one dead-letter notification
per settle."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import asyncpg

from relay.app import database_config
from relay.interfaces import Settlement
from relay.pg.connection import connect
from relay.pg.store import Outbox
from relay.settings import Settings
from tests.helpers import wait_until
from tests.kit.producer import insert_rows


async def _worker_setting(dsn: str, name: str) -> str:
    outbox = await Outbox.open(database_config(Settings(pg_dsn=dsn)))
    try:
        async with outbox._pool.acquire() as conn:
            return str(await conn.fetchval(f"SHOW {name}"))
    finally:
        await outbox.close()


async def test_worker_sessions__commit_without_waiting_for_the_flush(db: str) -> None:
    assert await _worker_setting(db, "synchronous_commit") == "off"
    # Sessions that only wait on locks or LISTEN keep the server's default.
    listener = await connect(database_config(Settings(pg_dsn=db)), "listener")
    try:
        assert await listener.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await listener.close()


async def test_worker_sessions__the_dsn_options_win(db: str) -> None:
    options = quote("-c synchronous_commit=on")
    dsn = db + ("&" if "?" in db else "?") + f"options={options}"
    assert await _worker_setting(dsn, "synchronous_commit") == "on"


async def test_claims__every_statement_of_the_transaction_is_prepared_before_it_begins(
    db: str,
) -> None:
    """A statement asyncpg prepares inside the claim's transaction leaves the server waiting
    with no timer running (`active`, ClientRead) while its answer travels: a link cut then
    kept the rows locked. The first claim of a connection prepares them before BEGIN."""
    outbox = await Outbox.open(database_config(Settings(pg_dsn=db)))
    try:
        async with outbox.claim(10) as batch:
            conn = batch._conn
            began = await conn.fetchval("SELECT now()")
            prepared = {r["statement"]: r["prepare_time"] for r in await conn.fetch(
                "SELECT statement, prepare_time FROM pg_prepared_statements")}
        q = outbox.q
        for name in ("claim", "delete_published", "reschedule_failed", "dead_letter"):
            assert q[name] in prepared, f"{name} not prepared"
            assert prepared[q[name]] < began, f"{name} prepared inside the transaction"
        async with outbox.claim(10, express=True) as batch:
            conn = batch._conn
            began = await conn.fetchval("SELECT now()")
            express = await conn.fetchval(
                "SELECT prepare_time FROM pg_prepared_statements WHERE statement = $1",
                q["claim_express"])
        assert express is not None
        assert express < began, "claim_express prepared inside the transaction"
    finally:
        await outbox.close()


async def test_parking__one_notification_per_settle_with_the_count_and_none_when_empty(
    db: str,
) -> None:
    """The dead-letter channel hears how many rows one settle parked, in the statement that
    parks them; the empty run that prepares that statement sends nothing."""
    await insert_rows(db, "x", "rk", range(3))
    heard: list[str] = []
    listener = await asyncpg.connect(db)
    await listener.add_listener("queue_message_notify_dead",
                                lambda *args: heard.append(args[3]))
    outbox = await Outbox.open(database_config(Settings(pg_dsn=db)))
    try:
        async with outbox.claim(10) as batch:
            ids = [r.id for r in batch.rows]
            await batch.settle(Settlement(dead=[(i, "internal: test", True) for i in ids[:2]],
                                          published=ids[2:]))
            await batch.commit()
        async with outbox.claim(10) as batch:  # nothing left: a claim, no settle
            assert not batch.rows
        await wait_until(lambda: heard, timeout_s=5, what="the dead-letter notification")
        await asyncio.sleep(0.3)
        assert len(heard) == 1
        assert json.loads(heard[0])["count"] == 2
    finally:
        await outbox.close()
        await listener.close()
