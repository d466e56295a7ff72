"""Property: whatever reasons a settle parks rows with (any text PostgreSQL stores: multi-byte
characters, quotes, `%`, backslashes, control characters, any length), the dead-letter
statement parks every row, its NOTIFY payload is JSON within PostgreSQL's 8,000 bytes with the
first reason cut at 500 characters, and the server raises exactly one WARNING.

Real PostgreSQL, the test's own migrated database."""

from __future__ import annotations

import asyncio
import json

import asyncpg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relay.pg.queries import Queries, TableNames
from tests.kit.producer import insert_rows

NAMES = TableNames(None, "queue_message", "queue_message_notify")
Q = Queries(NAMES)
# Text PostgreSQL stores: no NUL, no lone surrogates.
_reason = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                  max_size=3000)


async def _run(dsn: str, reasons: list[str]) -> None:
    heard: list[str] = []
    warnings: list[str] = []
    listener = await asyncpg.connect(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await listener.add_listener(NAMES.dead_channel, lambda *args: heard.append(args[3]))
        conn.add_log_listener(lambda _c, m: warnings.append(m.message)
                              if m.severity == "WARNING" else None)
        await conn.execute("TRUNCATE queue_message, queue_message_dead")
        ids = await insert_rows(conn, "x", "rk", [{}] * len(reasons))
        async with conn.transaction():
            parked = await conn.fetchval(Q["dead_letter"], ids, reasons, [True] * len(ids))
        for _ in range(50):
            if heard:
                break
            await asyncio.sleep(0.02)
        stored = await conn.fetchval("SELECT array_agg(reason ORDER BY reason) "
                                     "FROM queue_message_dead")
    finally:
        await listener.close()
        await conn.close()
    assert parked == len(reasons)
    assert sorted(stored) == sorted(reasons)
    assert len(heard) == 1
    assert len(heard[0].encode()) < 8000
    payload = json.loads(heard[0])
    assert payload == {"table": "queue_message", "count": len(reasons), "id": ids[0],
                       "reason": reasons[0][:500]}
    assert len(warnings) == 1
    assert warnings[0].startswith(f"outbox-relay parked {len(reasons)} row(s) of queue_message")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(reasons=st.lists(_reason, min_size=1, max_size=5))
@example(reasons=["%s %% \\ ' \" \n\t é 😀" * 200])  # RAISE's own % and a long 4-byte tail
@example(reasons=["\x01\x1f" * 400])  # control characters: 6 bytes each as JSON escapes
def test_dead_letter__any_reason_is_parked_announced_once_and_logged_once(
    db: str, reasons: list[str]
) -> None:
    asyncio.run(_run(db, reasons))
