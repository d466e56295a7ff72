"""Property: every claim statement (`claim` with keyed and unkeyed rows, `claim_express`,
`claim_single_active`) hands a row's content exactly when its UTF-8 bytes fit
RELAY_MAX_MESSAGE_BYTES, and otherwise withholds it and says its size, whatever the content's
characters (multi-byte, escapes) and wherever the limit falls.

Real PostgreSQL, the test's own migrated database; each example starts from an empty table.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relay.pg.queries import Queries
from relay.pg.seqfloor import FROM_START
from tests.conftest import NAMES

Q = Queries(NAMES)
NO_BYTE_LIMIT = 1 << 30

_content = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=60)
_row = st.tuples(_content, st.sampled_from([None, None, "a", "b"]))


async def _claims(conn: asyncpg.Connection, limit: int) -> dict[str, list[asyncpg.Record]]:
    """Each statement's claim of every row, each in a transaction rolled back."""
    out = {}
    for name, args in (
        ("claim", (Q["claim"], 1000, 64, False, NO_BYTE_LIMIT, FROM_START, True, None, limit,
                   None, FROM_START, False)),
        ("claim_express", (Q["claim_express"], 64, NO_BYTE_LIMIT, FROM_START, "0", limit)),
        ("claim_single_active", (Q["claim_single_active"], 1000, False, NO_BYTE_LIMIT, limit,
                                 0, 4064)),
    ):
        tx = conn.transaction()
        await tx.start()
        try:
            # claim_single_active's last row (id NULL) says what its walk saw, not a row.
            out[name] = [r for r in await conn.fetch(*args) if r["id"] is not None]
        finally:
            await tx.rollback()
    return out


async def _run(dsn: str, rows: list[tuple[str, str | None]], limit: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE queue_message")
        for text, key in rows:
            # Hand-written: the JSON text exactly as written (not re-encoded) is the subject.
            await conn.execute(
                "INSERT INTO queue_message (exchange, routing_key, content, ordering_key) "
                "VALUES ('x', 'rk', $1::jsonb, $2)", json.dumps(text, ensure_ascii=False), key)
        stored = {r["id"]: (r["body"], r["key"]) for r in await conn.fetch(
            "SELECT id::text AS id, convert_to(content::text, 'UTF8') AS body, "
            "ordering_key AS key FROM queue_message")}
        for name, got in (await _claims(conn, limit)).items():
            expected_ids = set(stored) if name != "claim_express" else {
                i for i, (_, key) in stored.items() if key is None}
            assert {r["id"] for r in got} == expected_ids, name
            for r in got:
                body = stored[r["id"]][0]
                if len(body) <= limit:
                    assert (r["content"], r["withheld"]) == (body, None), (name, limit, body)
                else:
                    assert (r["content"], r["withheld"]) == (None, len(body)), (name, limit)
    finally:
        await conn.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=st.lists(_row, min_size=1, max_size=12), limit=st.integers(1, 200))
@example(rows=[("é" * 3, None)], limit=7)  # 6 bytes of letters and 2 quotes: one over
@example(rows=[("\n", "a")], limit=4)  # stored as the escape "\n": 4 bytes, fits
def test_claims__withhold_exactly_the_content_over_the_message_limit(
    db: str, rows: list[tuple[str, str | None]], limit: int
) -> None:
    asyncio.run(_run(db, rows, limit))
